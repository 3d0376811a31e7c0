NUM_GPUS = 0
"""The dashboard's server over a run directory (a written one: no training): every request
needs the token, it binds only its host, its views are the run's files, it serves the
page and nothing else; `dynarl train`'s run.dashboard and `dynarl dashboard RUN_DIR`."""

import asyncio
import contextlib
import fcntl
import math
import socket
import struct

import httpx
import pytest
import yaml

from dynarl.components.workflows import jsonl
from dynarl.components.workflows.config import load_config
from dynarl.launch.dashboard.server import DashboardServer, TokenGuard, finite
from dynarl.transport.errors import ConfigError

TOKEN = "t0ken-for-tests_123"


def write_run(run_dir, steps=3):
    """A run directory as `dynarl train` leaves it (config.yaml, metrics.jsonl, spans.jsonl,
    samples_text.jsonl), without the training."""
    config = {"workflow": "grpo", "scheduler": {"policy": "dynarl"}, "run": {"steps": 5, "log_samples": 2},
              "runtime": {"cluster": {"num_nodes": 1, "devices_per_node": 2, "device_kind": "cpu"}}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    for n in range(steps):
        t = 10.0 * n
        jsonl.append(str(run_dir / "metrics.jsonl"), {
            "step": n, "reward_mean": 0.1 * n, "loss": math.nan if n == 1 else 0.5, "time": 1.0e9 + n,
            "plans": [{"at_s": t + 1.0, "at_vs_rollout_end_s": -0.5, "moves": [["rollout", "trainer", 1]],
                       "predicted_s": 1.0, "current_s": 2.0, "measured_s": 1.25}],
            "device_counts_vs_rollout_end_s": [[-0.5, {"rollout": 1, "trainer": 2}]]})
        jsonl.append(str(run_dir / "spans.jsonl"), {"step": n, "spans": [
            ["rollout", [0, 1], t, t + 1.0, f"step {n}"], ["trainer", [1, 0], t + 1.5, t + 3.0, f"step {n}"]]})
        jsonl.append(str(run_dir / "samples_text.jsonl"), {"step": n, "samples": [
            {"id": f"{n}/0", "reward": 0.0, "prompt": "p", "response": "r", "tokens": ["r"], "logprobs": [-0.5]},
            {"id": f"{n}/1", "reward": 1.0, "prompt": "q", "response": "s", "tokens": ["s"], "logprobs": [-0.1]}]})


@contextlib.asynccontextmanager
async def served(run_dir, **kw):
    server = DashboardServer(str(run_dir), TOKEN, **kw)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http.url(""), timeout=30) as client:
            yield server, client
    finally:
        await server.stop()


def bearer(token=TOKEN):
    return {"authorization": f"Bearer {token}"}


@pytest.mark.parametrize("path, headers, status", [
    ("/", {}, 401),
    ("/api/summary", {}, 401),
    ("/no/such/path", {}, 401),  # refused before routing: a path without the token says nothing
    ("/static/dashboard.js", {}, 401),
    ("/?token=", {}, 401),
    ("/?token=wrong", {}, 403),
    ("/api/summary?token=" + TOKEN[:-1], {}, 403),
    ("/api/summary?token=" + TOKEN + "x", {}, 403),
    ("/api/summary", bearer("wrong"), 403),
    ("/api/summary", {"authorization": f"Basic {TOKEN}"}, 401),
    ("/api/summary", bearer(), 200),
    ("/api/summary?token=" + TOKEN, {}, 200),
    ("/no/such/path", bearer(), 404),
    ("/static/..%2F..%2Fserver.py", bearer(), 404),  # only the page's own files
    ("/static/index.html", bearer(), 404),
    ("/api/nothing", bearer(), 404),
    ("/api/step?step=x", bearer(), 400),
    ("/api/sample?id=1", bearer(), 400),
])
async def test_every_request_needs_the_token(tmp_path, path, headers, status):
    write_run(tmp_path)
    async with served(tmp_path) as (server, client):
        r = await client.get(path, headers=headers)
        assert r.status_code == status, r.text
        if status in (401, 403):
            assert r.headers["www-authenticate"] == "Bearer" and TOKEN not in r.text
            assert server.app.refused == 1


async def test_it_binds_only_its_host(tmp_path):
    write_run(tmp_path)
    async with served(tmp_path) as (server, client):
        host, port = server.http.socket.getsockname()[:2]
        assert host == "127.0.0.1" and port == server.http.port > 0
        assert server.url == f"http://127.0.0.1:{port}/?token={TOKEN}"
        assert (await client.get("/api/summary", headers=bearer())).status_code == 200
        outward = _outward_address()
        if outward is not None:  # the machine's own other address: nothing listens there
            with pytest.raises(OSError):
                socket.create_connection((outward, port), timeout=2).close()
    with socket.socket() as taken:  # a port in use: an error from start(), nothing left running
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            await DashboardServer(str(tmp_path), TOKEN, port=taken.getsockname()[1]).start()
    with pytest.raises(ValueError, match="token"):
        TokenGuard(None, "")
    assert len(DashboardServer(str(tmp_path)).token) >= 20  # a new token of its own


def _outward_address():
    """One of this machine's own IPv4 addresses that is not loopback (its interfaces'), if any."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
        address = socket.inet_ntoa(packed[20:24])
        if not address.startswith("127."):
            return address
    return None


async def test_the_views_are_the_runs_files(tmp_path):
    write_run(tmp_path)
    async with served(tmp_path) as (server, client):
        async def get(path):
            r = await client.get(path, headers=bearer())
            assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
            return r.json()
        summary = await get("/api/summary")
        assert (summary["steps_done"], summary["steps_total"], summary["num_devices"]) == (3, 5, 2)
        assert summary["running"] is False  # nobody holds run.lock
        curves = {c["id"]: c for c in await get("/api/curves")}
        assert curves["reward"]["x"] == [1, 2, 3]
        assert curves["reward"]["series"][0]["values"] == pytest.approx([0.0, 0.1, 0.2])
        assert curves["loss"]["series"][0]["values"] == [0.5, None, 0.5]  # NaN: null (JSON has no NaN)
        plans = (await get("/api/migrations"))["plans"]
        assert [(p["step"], p["predicted_gain_s"], p["measured_gain_s"]) for p in plans] == \
            [(0, 1.0, 0.75), (1, 1.0, 0.75), (2, 1.0, 0.75)]
        view = await get("/api/step")
        assert (view["step"], view["devices"], view["duration_s"]) == (2, 2, 3.0)
        assert [s["component"] for s in view["spans"]] == ["rollout", "trainer"]
        assert (await get("/api/step?step=0"))["step"] == 0
        assert await get("/api/step?step=9") is None
        picked = await get("/api/samples?min_reward=0.5")
        assert [s["id"] for s in picked["samples"]] == ["2/1", "1/1", "0/1"] and picked["steps"] == [0, 1, 2]
        assert [s["id"] for s in (await get("/api/samples?step=1&max_reward=0.5"))["samples"]] == ["1/0"]
        assert (await get("/api/sample?step=1&id=1/1"))["logprobs"] == [-0.1]
        # the run goes on: a new step is seen on the next request
        write_more = tmp_path / "more"
        write_more.mkdir()
        write_run(write_more, steps=4)
        with open(tmp_path / "metrics.jsonl", "a") as f:
            f.write((write_more / "metrics.jsonl").read_text().splitlines()[3] + "\n")
        assert (await get("/api/summary"))["steps_done"] == 4


async def test_the_page_and_its_files_are_served_with_the_token_in_them(tmp_path):
    write_run(tmp_path)
    async with served(tmp_path) as (server, client):
        page = await client.get("/", params={"token": TOKEN})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "{{TOKEN}}" not in page.text and f"/static/dashboard.js?token={TOKEN}" in page.text
        assert "script-src" not in page.headers["content-security-policy"]  # default-src 'self': no inline script
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["referrer-policy"] == "no-referrer"
        for name, kind in (("dashboard.js", "text/javascript"), ("uPlot.iife.min.js", "text/javascript"),
                           ("dashboard.css", "text/css"), ("uPlot.min.css", "text/css")):
            r = await client.get(f"/static/{name}", params={"token": TOKEN})
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and len(r.content) > 500
        assert (await client.post("/api/summary", headers=bearer())).status_code == 405  # it only reads


def test_non_finite_numbers_become_null():
    assert finite({"a": [1.0, math.inf, {"b": -math.inf}], "c": math.nan, "d": "x"}) == \
        {"a": [1.0, None, {"b": None}], "c": None, "d": "x"}


# --- in `dynarl train` (run.dashboard) and as `dynarl dashboard RUN_DIR` ------------------

class Notes:
    def __init__(self):
        self.lines = []

    def note(self, text):
        self.lines.append(text)


@pytest.mark.parametrize("overrides, error", [
    ([("run.dashboard", {})], None),
    ([("run.dashboard.port", 8265), ("run.dashboard.host", "::1")], None),
    ([("run.dashboard.port", 70000)], "run.dashboard.port: must be an integer in [0, 65535]"),
    ([("run.dashboard.host", "")], "run.dashboard.host: must be an address"),
    ([("run.dashboard.bind", "x")], "run.dashboard.bind: unknown key"),
    ([("run.log_samples", -1)], "run.log_samples: must be an integer >= 0"),
    ([("run.log_samples", 2), ("trainer.streaming", True)], "run.log_samples: a streaming trainer"),
    ([("workflow", "embodied"), ("run.log_samples", 2)], "run.log_samples: the embodied workflow's samples"),
])
def test_the_config(overrides, error):
    if error is None:
        assert load_config(None, overrides).run.dashboard is not None
    else:
        with pytest.raises(ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
            load_config(None, overrides)


async def test_the_train_job_serves_its_run_directory_and_prints_the_address(tmp_path):
    from dynarl.launch.train_job import Job
    write_run(tmp_path)
    cfg = load_config(None, [("run.dashboard", {})])
    job = Job(cfg, None, None, str(tmp_path), None)
    notes = Notes()
    server = await job._dashboard(notes)
    try:
        assert notes.lines == [f"dashboard {server.url}"] and "?token=" in server.url
        async with httpx.AsyncClient() as client:
            assert (await client.get(server.url)).status_code == 200
            assert (await client.get(server.url.split("?")[0])).status_code == 401
        with pytest.raises(ConfigError, match="run.dashboard: cannot serve on 127.0.0.1:"):
            taken = load_config(None, [("run.dashboard.port", server.http.port)])
            await Job(taken, None, None, str(tmp_path), None)._dashboard(notes)
    finally:
        await server.stop()
    assert await Job(load_config(None, []), None, None, str(tmp_path), None)._dashboard(notes) is None


def test_the_dashboard_command_refuses_what_is_not_a_run_directory(tmp_path, capsys):
    from dynarl.launch.cli import main
    assert main(["dashboard", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    write_run(tmp_path)
    assert main(["dashboard", str(tmp_path), "--port", "70000"]) == 2


async def test_the_dashboard_command_serves_until_stopped(tmp_path, capsys):
    from dynarl.launch.dashboard.cli import serve
    write_run(tmp_path)
    server = DashboardServer(str(tmp_path))
    task = asyncio.create_task(serve(server))
    for _ in range(100):
        if server.http.socket is not None:
            break
        await asyncio.sleep(0.05)
    async with httpx.AsyncClient() as client:
        r = await client.get(server.url.replace("/?", "/api/summary?"))
    assert r.status_code == 200 and r.json()["steps_done"] == 3
    assert server.url in capsys.readouterr().out
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert server.http.socket.fileno() == -1  # stopped: its socket closed
