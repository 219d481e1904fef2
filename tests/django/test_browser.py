"""The admin in a real browser (Debian's headless Chromium through Selenium)
against pytest-django's live server: log in, add a stored schedule, preview
its next runs, save it, run it now, pause it, and see the refusal of a run
while it is paused.

Every step takes a screenshot, so that the test exercises what the docs
show: with ``SB_SCREENSHOTS=1`` they are written to docs/_static/admin/
(docs/django-admin.md uses them), otherwise to a temporary folder. Skipped
without chromium and chromedriver, except in CI, where that fails.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_support import SimulatedReplica, close_stores, unique
from django.contrib.auth.models import User
from tests_conftest import IN_CI

from celery_singlebeat.contrib.django import store
from celery_singlebeat.contrib.django.models import Pause, Slot
from celery_singlebeat.exceptions import ScheduleNotFound

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["close_stores"]  # the fixture, used by every test here (autouse)

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "_static" / "admin"
#: how long a page may take to show what a step waits for
WAIT_S = 15


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.exists(p) or shutil.which(p))]
    if missing:
        if IN_CI:
            pytest.fail(
                f"the browser test needs {', '.join(missing)} "
                "(apt-get install chromium chromium-driver)"
            )
        pytest.skip(f"no {', '.join(missing)}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    if os.environ.get("SB_SCREENSHOTS") == "1":
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        return DOCS_SHOTS
    return tmp_path


def test_add_preview_run_now_and_pause_in_a_browser(
    browser: Any, shots: Path, live_server: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    def wait_for(css: str) -> Any:
        return WebDriverWait(browser, WAIT_S).until(
            ec.presence_of_element_located((By.CSS_SELECTOR, css))
        )

    def shot(name: str, focus: str | None = None) -> None:
        if focus is not None:  # what the step is about, in view
            element = browser.find_element(By.CSS_SELECTOR, focus)
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
        path = shots / f"{name}.png"
        assert browser.save_screenshot(str(path)), path
        assert path.stat().st_size > 10_000  # a page, not a blank

    def act(action: str, name: str) -> None:
        browser.find_element(
            By.CSS_SELECTOR, f'input[name="_selected_action"][value="{name}"]'
        ).click()
        Select(browser.find_element(By.NAME, "action")).select_by_value(action)
        browser.find_element(By.CSS_SELECTOR, 'button[name="index"]').click()
        wait_for("#confirm")

    # a fleet to look at: one replica with two beat_schedule entries, sent slots
    replica = SimulatedReplica()
    names = [unique("beat-report"), unique("beat-cleanup")]
    replica.publish(names)
    for name in names:
        replica.send(name)
    User.objects.create_superuser("ops", "ops@example.com", "correct-horse")

    browser.get(live_server.url + "/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys("correct-horse")
    browser.find_element(By.CSS_SELECTOR, 'input[type="submit"]').click()
    wait_for("#site-name")

    # add a stored schedule and preview its next runs before saving
    name = unique("nightly-export")
    browser.get(live_server.url + "/admin/celery_singlebeat/storedschedule/add/")
    browser.find_element(By.NAME, "name").send_keys(name)
    browser.find_element(By.NAME, "task").send_keys("proj.tasks.export")
    browser.find_element(By.NAME, "cron").send_keys("30 2 * * *")
    browser.find_element(By.NAME, "tz").send_keys("Europe/Paris")
    browser.find_element(By.NAME, "kwargs").clear()
    browser.find_element(By.NAME, "kwargs").send_keys('{"format": "csv"}')
    browser.find_element(By.NAME, "why").send_keys("the nightly export for finance")
    browser.find_element(By.ID, "preview").click()
    wait_for("#next-runs")
    runs = browser.find_elements(By.CSS_SELECTOR, "li.next-run")
    assert len(runs) == 5 and all(":30:00 UTC" in r.text for r in runs), [r.text for r in runs]
    shot("preview", "#next-runs")
    with pytest.raises(ScheduleNotFound):  # a preview writes nothing
        store.schedules().get(name)

    browser.find_element(By.NAME, "_save").click()
    wait_for("#result_list")
    assert store.schedules().get(name).task == "proj.tasks.export"
    shot("stored-schedules")

    # run it now: a confirmation page, then a request row the replicas send
    act("run_entries_now", name)
    browser.find_element(By.NAME, "reason").send_keys("finance asked for today's")
    shot("run-now-confirmation")
    browser.find_element(By.ID, "confirm").click()
    assert "Requested a run" in wait_for(".messagelist").text
    assert Slot.objects.filter(entry=name, fence=0).count() == 1

    # pause it, with a reason
    act("pause_entries", name)
    browser.find_element(By.NAME, "reason").send_keys("month-end freeze")
    shot("pause-confirmation")
    browser.find_element(By.ID, "confirm").click()
    assert "Paused" in wait_for(".messagelist").text
    assert Pause.objects.get(entry=name).reason == "month-end freeze"

    # a run now while paused is refused, and says why
    act("run_entries_now", name)
    browser.find_element(By.ID, "confirm").click()
    message = wait_for(".messagelist").text
    assert "refused" in message and "paused" in message
    assert Slot.objects.filter(entry=name, fence=0).count() == 1
    shot("refused-while-paused")

    # the entry's page: its next runs and the store's history
    browser.get(f"{live_server.url}/admin/celery_singlebeat/storedschedule/{name}/change/")
    assert "the nightly export for finance" in wait_for("#schedule-history").text
    shot("stored-schedule-change", "#schedule-history")

    # the fleet's pages
    browser.get(live_server.url + "/admin/celery_singlebeat/entry/")
    assert names[0] in wait_for("#result_list").text
    shot("entries")
    browser.get(live_server.url + "/admin/celery_singlebeat/slot/?entry=" + names[0])
    assert replica.id in wait_for("#result_list").text
    shot("slots")
    browser.get(live_server.url + "/admin/celery_singlebeat/replica/")
    wait_for("#result_list")
    shot("replicas")
