"""The dashboard as a person sees it, in a real browser (Debian's chromium, headless, driven by
selenium through chromedriver): DashboardTests runs it against a live host.

  dashboard_browser.py URL BGTASK STATE SCREENSHOTS

Checks, failing with a message naming what was missing:
  - the timeline shows a bar per launch of the host's history, each with its termination
    (an exited or suspended one, a watchdog kill, a jetsam kill), coloured by it;
  - the pending table shows the held request with why it has not run;
  - a launch started after the page loaded (with the real CLI: BGTASK simulate-launch) appears
    on the timeline without a reload (server-sent events);
  - the filter box narrows the timeline's rows (to none, for a name no app has);
  - a click on a bar opens its launch: the record and its log; the watchdog-killed launch's
    memory against the jetsam line and its CPU, drawn from the supervisor's samples;
  - the action forms (the host runs with --http-actions): a push sent from the page appears on
    the timeline; the device put on power from the page clears the held request's why.
Saves screenshots (timeline.png, launch.png) into SCREENSHOTS. Prints one JSON line of what it
saw on success.
"""
import json
import os
import subprocess
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def wait_for(driver, what, condition, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    driver.save_screenshot(os.path.join(sys.argv[4], "failure.png"))
    raise SystemExit(f"dashboard: {what} did not appear within {timeout} s")


def bars(driver):
    # Read in one script: the timeline is redrawn every second, and an element found in one
    # call may be gone by the next.
    return [tuple(b) for b in driver.execute_script(
        "return [...document.querySelectorAll('#timeline rect.bar')]"
        ".map(b => [b.dataset.launch, b.dataset.termination, b.getAttribute('fill')])")]


def main():
    url, bgtask, state, shots = sys.argv[1:5]
    os.makedirs(shots, exist_ok=True)
    options = Options()
    for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1100",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking"]:
        options.add_argument(argument)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.get(url)
        # The three ended launches, each with its termination.
        seen = wait_for(driver, "the three launches' bars", lambda: (lambda b: b if len(b) >= 3 else None)(bars(driver)))
        terminations = sorted(t for _, t, _ in seen)
        for wanted in ["watchdog", "jetsam"]:
            if wanted not in terminations:
                raise SystemExit(f"dashboard: no {wanted} bar on the timeline (bars: {terminations})")
        if not any(t in ("exited", "suspended") for t in terminations):
            raise SystemExit(f"dashboard: no bar of a launch that ended as asked (bars: {terminations})")
        colours = {t: f for _, t, f in seen}
        if len({colours["watchdog"], colours["jetsam"]}) != 2:
            raise SystemExit(f"dashboard: a watchdog kill and a jetsam kill look the same: {colours}")
        # The held request and why.
        why = wait_for(driver, "the pending request's why", lambda: next((text for text in driver.execute_script(
            "return [...document.querySelectorAll('#pending tbody tr')].map(r => r.innerText)") if "power" in text.lower()), None))
        wait_for(driver, "the live indicator", lambda: "off" not in driver.find_element(By.ID, "live").get_attribute("class"))
        driver.save_screenshot(os.path.join(shots, "timeline.png"))
        # A launch started now appears without a reload.
        before = {launch for launch, _, _ in bars(driver)}
        marker = driver.execute_script("window.__bgtaskMarker = 1; return window.__bgtaskMarker")
        started = subprocess.run([bgtask, "simulate-launch", "com.example.misbehaving.ok", "--force", "--type", "processing", "--no-wait",
                                  "--state", state], capture_output=True, text=True, timeout=60)
        if started.returncode != 0:
            raise SystemExit(f"dashboard: bgtask simulate-launch failed: {started.stderr}")
        launch_id = started.stdout.strip().split()[-1]
        live = wait_for(driver, f"the new launch {launch_id} on the timeline",
                        lambda: next((b for b in bars(driver) if b[0] == launch_id), None))
        if driver.execute_script("return window.__bgtaskMarker") != marker:
            raise SystemExit("dashboard: the page reloaded instead of updating")
        # Its record and log, from a click on its bar once it has ended.
        wait_for(driver, f"launch {launch_id}'s end", lambda: next((b for b in bars(driver) if b[0] == launch_id and b[1] != "running"), None))
        # A click as a person makes it (the bar is redrawn each second: found and clicked in one script).
        driver.execute_script("document.querySelector(`#timeline rect.bar[data-launch='${arguments[0]}']`)"
                              ".dispatchEvent(new MouseEvent('click', {bubbles: true}))", launch_id)
        summary = wait_for(driver, "the launch's record", lambda: driver.find_element(By.ID, "launch-summary").text or None)
        log = wait_for(driver, "the launch's log", lambda: (lambda t: t if "misbehaving: ok" in t else None)(driver.find_element(By.ID, "launch-log").text))
        # The rows narrowed by the filter box, and back.
        driver.find_element(By.ID, "app-filter").send_keys("no-such-app")
        wait_for(driver, "the filter hiding every row", lambda: len(bars(driver)) == 0)
        driver.execute_script("const f = document.querySelector('#app-filter'); f.value = ''; f.dispatchEvent(new Event('input'))")
        wait_for(driver, "the bars back once the filter is cleared", lambda: len(bars(driver)) >= 4)
        # The watchdog kill's memory and CPU over its three seconds.
        killed = next(launch for launch, termination, _ in bars(driver) if termination == "watchdog")
        driver.execute_script("document.querySelector(`#timeline rect.bar[data-launch='${arguments[0]}']`)"
                              ".dispatchEvent(new MouseEvent('click', {bubbles: true}))", killed)
        points = wait_for(driver, "the killed launch's memory chart", lambda: driver.execute_script(
            "const c = document.querySelector('#usage-chart'); if (!c || !document.querySelector('#launch-title').textContent.startsWith(arguments[0])) return null;"
            "const line = c.querySelector('polyline.mem-line'); return line && c.querySelector('.jetsam-line') ? line.getAttribute('points').split(' ').length : null", killed))
        driver.execute_script("document.querySelector('#launch-section').scrollIntoView()")
        driver.save_screenshot(os.path.join(shots, "launch.png"))
        # The forms: a push, then the device on power.
        wait_for(driver, "the actions panel", lambda: driver.find_element(By.ID, "actions-section").is_displayed())
        driver.find_element(By.CSS_SELECTOR, "#act-push button").click()
        wait_for(driver, "the push's answer", lambda: (lambda t: t if t.startswith("push") else None)(driver.find_element(By.ID, "action-result").text))
        push_mark = wait_for(driver, "the push on the timeline", lambda: driver.execute_script("return document.querySelectorAll('#timeline circle.push').length > 0"))
        device = driver.find_element(By.ID, "act-device")
        device.find_element(By.CSS_SELECTOR, "select[name=condition]").send_keys("power")
        device.find_element(By.CSS_SELECTOR, "select[name=value]").send_keys("on")
        device.find_element(By.TAG_NAME, "button").click()
        power_cleared = wait_for(driver, "the held request's why without power", lambda: not any("power" in text.lower() for text in driver.execute_script(
            "return [...document.querySelectorAll('#pending tbody tr')].map(r => r.innerText)")))
        print(json.dumps({"bars": terminations, "why": why, "live": live[0], "new": launch_id not in before,
                          "summary": summary.splitlines()[:3], "log_lines": len(log.splitlines()), "chart_points": points,
                          "push_mark": push_mark, "power_cleared": power_cleared}))
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
