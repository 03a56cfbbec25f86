"""The dashboard in a real browser while a partition is damaged: the page keeps refreshing
and shows the damage where an operator looks (the topic, its partition with the reason, the
group reading it), instead of going dark on a 503."""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.gateway.test_damage_disclosure import (
    ADMIN_TOKEN,
    DAMAGED,
    GROUP,
    TOPIC,
    damaged_installation,
)
from tests.ui.test_dashboard import cell_text, enter_token, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_dashboard_shows_a_damaged_partition_and_goes_on_refreshing(
    browser: webdriver.Chrome, tmp_path: Path
) -> None:
    installation = damaged_installation(tmp_path)
    try:
        browser.get(installation.gateway.url + "/ui")
        wait_for(browser, "asked for a token", lambda: browser.find_element(By.ID, "token-input"))
        enter_token(browser, ADMIN_TOKEN)

        topic_row = f'#topics tr[data-topic="{TOPIC}"][data-damaged="1"]'
        badge = wait_for(
            browser, "marked the topic damaged", lambda: cell_text(browser, topic_row + " .damaged")
        )
        assert badge == "1 damaged partition"
        partition_row = f'#partitions tr[data-partition="{TOPIC}/{DAMAGED}"][data-damaged="1"]'
        reason = wait_for(
            browser,
            "gave the partition's reason",
            lambda: cell_text(browser, partition_row + " .reason"),
        )
        assert "acknowledged data is missing" in reason
        group_row = f'#groups tr[data-group="{GROUP}"][data-damaged="1"]'
        marked = wait_for(
            browser, "marked the group", lambda: cell_text(browser, group_row + " .damaged")
        )
        assert marked == "1 damaged partition"
        assert cell_text(browser, group_row + " td.lag") == "0"  # the other partitions' lag

        # it goes on refreshing: a later answer is drawn too, with no error shown
        browser.execute_script("document.body.dataset.updated = ''")
        wait_for(
            browser,
            "refreshed again",
            lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-updated"),
        )
        assert "error" not in str(browser.find_element(By.ID, "status").get_attribute("class"))
    finally:
        installation.gateway.kill()
