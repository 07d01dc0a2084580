"""The shell people use: the `rsieve` command line (`app`), the HTTP client of the API
(`client`: upload a pool, submit, wait) and the local stack (`local`: Redis, SeaweedFS,
Triton and the workers as processes on this machine). It may import the services and the
adapters; nothing imports it but entry points, tests and benchmarks (CONTRIBUTING.md)."""
