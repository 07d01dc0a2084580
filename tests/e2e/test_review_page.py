"""The review page in real headless Chromium (Debian's /usr/bin/chromium driven by
Playwright; no browser is downloaded) on a finished replay run: images load, verdicts
show, filters narrow the list, a person's call on a judge promotion is stored."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

import httpx
import pytest

from rsieve.adapters.pools import upload_pool
from rsieve.adapters.storage import S3Store
from rsieve_cli.client import submit, wait_for_run
from rsieve_cli.local.stack import Stack
from tests.conftest import stack_settings
from tests.e2e.conftest import SCENARIO_API_TOKEN
from tests.e2e.scenario import Scenario, build

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# One stack with test_replay_pipeline (tests/e2e/conftest.py, scenario_stack).
SHARED_STACK = "scenario"
TOKEN = SCENARIO_API_TOKEN
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Debian chromium missing (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def finished(
    scenario_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Stack, str, Scenario]:
    scenario = build(tmp_path_factory.mktemp("pool") / "review-pool")
    stack = scenario_stack
    settings = stack_settings(stack)
    run = submit(settings, upload_pool(S3Store(settings), scenario.folder), "review-test")
    wait_for_run(settings, run, timeout=300)
    return stack, run, scenario


def test_review_page_shows_filters_and_records(
    finished: tuple[Stack, str, Scenario], tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    stack, run, _ = finished
    api = stack_settings(stack).api_url
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        # The page runs under the API's content security policy: anything it does that the
        # policy forbids shows up here.
        violations: list[str] = []
        page.on(
            "console",
            lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None,
        )
        page.goto(f"{api}/review?run={run}")
        page.fill("#token", TOKEN)
        page.press("#token", "Enter")
        page.dispatch_event("#token", "change")
        cards = page.locator("article")
        expect(cards.first).to_be_visible(timeout=20_000)
        total = cards.count()
        assert total >= 4
        # Every image arrives (fetched with the token) and decodes.
        # Polled through DevTools' evaluate (wait_for_function would eval() in the page,
        # which the policy forbids, rightly).
        decoded = (
            "[...document.images].length > 0 && [...document.images].every("
            "i => i.complete && i.naturalWidth > 0)"
        )
        deadline = time.monotonic() + 20
        while not page.evaluate(decoded):
            assert time.monotonic() < deadline, "the images never all decoded"
            page.wait_for_timeout(200)
        expect(page.locator(".verdict .tag.CORRECT").first).to_be_visible()
        expect(page.locator(".verdict .tag.WRONG").first).to_be_visible()
        expect(page.locator(".decision").first).to_contain_text("alnum")

        page.select_option("#family", "SynthAmounts")
        expect(page.locator("#status")).to_contain_text("of 1")
        expect(cards.first).to_contain_text("truncated_reasoning")
        page.select_option("#family", "")
        page.select_option("#reason", "judge_unsure")
        expect(page.locator("#status")).to_contain_text("of 1")
        page.select_option("#reason", "judge_failed")
        expect(page.locator("#status")).to_contain_text("of 1")
        page.select_option("#reason", "")

        page.select_option("#kind", "promoted")
        expect(page.locator("#status")).to_have_text("1–1 of 1")
        promoted = page.locator("article[data-id='w-promoted']")
        expect(promoted).to_be_visible()
        expect(promoted).to_contain_text("not reviewed")
        promoted.locator("button.wrong-btn").click()  # a person's call, by mouse
        expect(promoted.locator(".review")).to_contain_text("wrong", timeout=10_000)
        promoted.press("c")  # ... and changed by keyboard on the selected card
        expect(promoted.locator(".review")).to_contain_text("confirmed", timeout=10_000)
        page.select_option("#kind", "all")
        expect(cards.nth(total - 1)).to_be_visible()
        assert violations == [], violations
        shot = tmp_path / "review.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert shot.stat().st_size > 10_000
    reviews = httpx.get(
        f"{api}/runs/{run}/reviews", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    assert [(r["item_id"], r["verdict"]) for r in reviews] == [("w-promoted", "confirmed")]
    wrong_kind = httpx.put(
        f"{api}/runs/{run}/reviews/w-wrong",
        json={"verdict": "wrong"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert wrong_kind.status_code == 404  # only judge promotions are reviewed
    # The page's images come from the pool's packs, exactly as uploaded.
    auth = {"Authorization": f"Bearer {TOKEN}"}
    items = httpx.get(f"{api}/runs/{run}/review/items", headers=auth).json()["data"]
    for sha in {i["image_sha256"] for i in items}:
        got = httpx.get(f"{api}/runs/{run}/images/{sha}", headers=auth)
        assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == sha
        assert got.headers["content-type"] == "image/png"
    assert httpx.get(f"{api}/runs/{run}/images/{'0' * 64}", headers=auth).status_code == 404
    assert httpx.get(f"{api}/runs/{run}/images/{items[0]['image_sha256']}").status_code == 401


def test_reviews_count_in_the_card_at_the_next_compaction(
    finished: tuple[Stack, str, Scenario],
) -> None:
    import time

    from services.worker import bootstrap

    stack, run, _ = finished
    settings = stack_settings(stack)
    api, auth = settings.api_url, {"Authorization": f"Bearer {TOKEN}"}
    stored = httpx.put(
        f"{api}/runs/{run}/reviews/w-promoted", json={"verdict": "wrong"}, headers=auth
    )
    assert stored.status_code == 200
    ctx = bootstrap(settings)
    store = ctx.store
    store.delete("datasets/review-test/manifest.json")  # force the next compaction
    assert ctx.reconcile(run) == [("rsieve.compact", {})]
    deadline = time.monotonic() + 60
    while not ctx.compacted(run):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    card = store.get(f"datasets/review-test/commits/{run}/README.md").decode()
    assert "### Reviewed by a person" in card
    assert "| SynthWords | 0 | 1 |" in card
