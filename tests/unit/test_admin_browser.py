"""An operator in a real browser: log in, find the stuck record with the filter, release it.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them)
and PostgreSQL; the admin runs on pytest-django's live server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from idempotency.models import IdempotencyRecord, Status
from tests.support.factories import IdempotencyRecordFactory, UserFactory

pytestmark = [
    pytest.mark.browser,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
]

CHROMIUM = os.environ.get("CHROMIUM_BINARY", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOT = os.environ.get("ADMIN_SCREENSHOT", "/tmp/idempotency-admin-release.png")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
]


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def operator():
    user = UserFactory(username="oncall", is_staff=True)
    codenames = ("view_idempotencyrecord", "resolve_idempotencyrecord")
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def test_operator_finds_the_stuck_record_and_releases_it(browser, live_server, operator):
    stuck = IdempotencyRecordFactory(expired_lease=True, idem_key="stuck-payment-1")
    in_flight = IdempotencyRecordFactory(in_flight=True, idem_key="running-payment-2")
    IdempotencyRecordFactory(succeeded=True, idem_key="done-payment-3")
    wait = WebDriverWait(browser, 10)

    browser.get(f"{live_server.url}/admin/login/?next=/admin/idempotency/idempotencyrecord/")
    browser.find_element(By.NAME, "username").send_keys("oncall")
    browser.find_element(By.NAME, "password").send_keys("secret")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(expected_conditions.presence_of_element_located((By.ID, "result_list")))
    assert "running-payment-2" in browser.page_source  # everything is listed at first

    browser.find_element(By.LINK_TEXT, "Expired lease or needs review").click()
    wait.until(expected_conditions.url_contains("stuck=yes"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1 and "stuck-payment-1" in rows[0].text

    rows[0].find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("release_for_retry")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    message = wait.until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".messagelist .success"))
    )
    assert "1 record released for retry" in message.text
    browser.save_screenshot(SCREENSHOT)

    assert IdempotencyRecord.objects.get(pk=stuck.pk).status == Status.FAILED_RETRYABLE
    assert IdempotencyRecord.objects.get(pk=in_flight.pk).status == Status.PROCESSING
    entry = LogEntry.objects.get(object_id=str(stuck.pk), action_flag=CHANGE)
    assert entry.user == operator
    assert entry.get_change_message() == "Status PROCESSING → FAILED_RETRYABLE."
