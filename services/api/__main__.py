"""`python -m services.api`: the API under uvicorn, on the address in RSIEVE_API_URL."""

from urllib.parse import urlparse

import uvicorn

from rsieve.settings import get_settings
from services.api.main import create_app

if __name__ == "__main__":
    url = urlparse(get_settings().api_url)
    uvicorn.run(
        create_app(), host=url.hostname or "127.0.0.1", port=url.port or 8080, log_level="warning"
    )
