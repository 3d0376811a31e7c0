NUM_GPUS = 0
"""The dashboard in a real browser (headless Chromium through selenium): a short
scheduler.policy=dynarl run on the CPU (4 logical devices, rollout 0-2, inference and
trainer sharing 3, as examples/dynarl_cpu.yaml), served live by `dynarl train`
(run.dashboard), then when it is over by `dynarl dashboard RUN_DIR`.

Live: the reward curve's points are metrics.jsonl's values, the ownership view shows
a move (a device rollout held in the step is the trainer's later in it) and the
scheduler's committed moves. Finished: every step is drawn, the samples table filters
by reward, a sample opens with its tokens' log-probs; a screenshot is saved.

Skips, saying why, without chromium, chromium-driver (Debian's packages: .ci/run
installs them) or selenium (the test extra)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest


CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if CHROMEDRIVER is None or CHROMIUM is None:
        return "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))

STEPS = 3
LOGGED = 4
JOB = ("runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3", "inference.num_ranks=1",
       "trainer.num_ranks=1", "run.prompts_per_step=8", "rollout.samples_per_prompt=8", "rollout.max_new_tokens=48",
       "rollout.chunk_size=2", f"run.steps={STEPS}",
       "scheduler.policy=dynarl", "scheduler.dynarl.interval_s=0.02", "scheduler.dynarl.charge_move_cost=false",
       "scheduler.dynarl.trainer_profile=home", "scheduler.dynarl.pack=8", "scheduler.dynarl.theta=0.6",
       f"run.log_samples={LOGGED}", "run.dashboard={}")
"""test_dynarl_train.py's job (a move in every step's tail) on the default task and warm start (rewards
that differ), a step more, logging samples, with the dashboard."""


class Process:
    """A `dynarl` command in a subprocess, its output lines collected as they come;
    stopped (SIGINT, then SIGKILL) and reaped on close."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "dynarl.launch.cli", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines[-40:])

    def wait_for(self, prefix: str, timeout: float) -> str:
        """The first output line that starts with `prefix`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((line for line in list(self.lines) if line.startswith(prefix)), None)
            if found is not None:
                return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.2)
        raise AssertionError(f"no line starting {prefix!r}; output:\n{self.output()}")

    def alive(self, condition):
        """`condition` for a wait that fails at once when the process has ended."""
        def check(driver):
            if self.proc.poll() is not None:
                raise AssertionError(f"the process ended ({self.proc.returncode}); output:\n{self.output()}")
            return condition(driver)
        return check

    def finish(self, timeout: float) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return rc

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # dynarl train stops its workers in order
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reader.join(timeout=10)


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,2400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver, condition, timeout: float, what: str):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition, message=what)


def loaded(driver) -> int:
    text = driver.execute_script("return document.body.dataset.loaded")
    return int(text) if text else 0


def metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def reward_chart(driver) -> tuple[list, list, list]:
    """The reward chart's data as uPlot holds it, as the DOM holds it, and how many of its
    canvas's pixels are drawn."""
    return driver.execute_script("""
        const holder = document.getElementById("chart-reward");
        const canvas = holder.querySelector("canvas");
        const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
        let drawn = 0;
        for (let i = 3; i < pixels.length; i += 4) if (pixels[i] > 0) drawn++;
        return [holder.uplot.data[0], holder.uplot.data[1], JSON.parse(holder.dataset.series).reward_mean,
                JSON.parse(holder.dataset.x), drawn];
    """)


def test_the_dashboard_shows_the_run_live_and_after(tmp_path, browser):
    from selenium.webdriver.common.by import By

    run_dir = str(tmp_path / "run")
    train = Process("train", *JOB, "--run-dir", run_dir)
    try:
        url = train.wait_for("dashboard ", timeout=300).split()[1]
        assert url.startswith("http://127.0.0.1:") and "/?token=" in url
        browser.get(url)
        # --- live: the first step is in, the run goes on
        wait(browser, train.alive(lambda d: loaded(d) >= 1), 600, "the page never showed a step")
        xs, ys, dom, dom_x, drawn = reward_chart(browser)
        rows = metrics(run_dir)[:len(xs)]
        assert xs == dom_x == [r["step"] + 1 for r in rows]
        assert ys == dom == pytest.approx([r["reward_mean"] for r in rows], abs=1e-12)
        assert drawn > 500  # uPlot drew the curve, its axes and grid
        owned = browser.execute_script("""
            const out = {};
            for (const r of document.querySelectorAll("#ownership-svg rect.own"))
                (out[r.dataset.component] ||= []).push(r.dataset.device);
            return out;""")
        moved = set(owned["rollout"]) & set(owned["trainer"])
        assert moved - {"3"}, owned  # a device rollout held in the step went to the trainer
        moves = [line.get_attribute("data-text") for line in browser.find_elements(By.CSS_SELECTOR, "line.move")]
        assert moves and all(m.startswith("rollout->trainer") for m in moves), moves
        assert train.finish(timeout=600) == 0, train.output()
    finally:
        train.close()
    step_lines = [line for line in train.lines if line.startswith("step ")]
    assert len(step_lines) == STEPS, train.output()
    assert all("moves " in line and "(rollout->trainer" in line for line in step_lines), step_lines

    # --- finished: `dynarl dashboard RUN_DIR` shows the whole run
    viewer = Process("dashboard", run_dir)
    try:
        url = viewer.wait_for("dashboard of ", timeout=60).split()[3]
        browser.get(url)
        wait(browser, viewer.alive(lambda d: loaded(d) == STEPS), 60, "the finished run's steps were not all shown")
        xs, ys, _, _, _ = reward_chart(browser)
        rows = metrics(run_dir)
        assert xs == [1, 2, 3] and ys == pytest.approx([r["reward_mean"] for r in rows], abs=1e-12)
        assert browser.find_element(By.ID, "run-status").text == "not running"

        logged = [s for line in open(os.path.join(run_dir, "samples_text.jsonl")) for s in json.loads(line)["samples"]]
        assert len(logged) == STEPS * LOGGED

        def shown(d):
            return d.execute_script("return [...document.querySelectorAll('#samples tbody tr')]"
                                    ".map(r => Number(r.dataset.reward))")
        wait(browser, lambda d: len(shown(d)) == len(logged), 30, "not every logged sample is listed")
        rewards = sorted(s["reward"] for s in logged)
        assert rewards[0] < rewards[-1], rewards
        cut = (rewards[0] + rewards[-1]) / 2
        high = [r for r in rewards if r >= cut]
        browser.find_element(By.ID, "min-reward").send_keys(repr(cut))
        wait(browser, lambda d: sorted(shown(d)) == pytest.approx(high), 30, "the reward filter did not apply")
        browser.find_element(By.CSS_SELECTOR, "#samples tbody tr").click()
        tokens = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#sample-tokens span"), 30,
                      "the sample did not open")
        assert all(float(t.get_attribute("data-logprob")) <= 0 for t in tokens)
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        viewer.close()
    assert viewer.proc.returncode == 0  # Ctrl-C ends it cleanly
