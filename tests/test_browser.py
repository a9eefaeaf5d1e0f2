"""Every notebook in a real browser: JupyterLab on loopback, headless Chromium driven by Playwright.

For each notebook in notebooks/ (new ones are picked up automatically): open it, clear the saved
outputs, run all cells, press every experiment's Run button (``.kvlab-run``, set by
kvlab.lessons.common.panel.ExperimentPanel), wait for the kernel to go idle, then assert that a figure is shown,
that every panel shows a result, and that no error output (and no panel error line) is on screen.
After Run All with the prediction boxes empty, no prediction's measured answer is on screen, and a
click on its fold shows it (kvlab.lessons.common.predict).
A full-page screenshot per notebook goes to test-artifacts/screenshots/NAME.png, the time of each
phase to test-artifacts/browser-timings.json.

Needs Playwright for Python (requirements.txt) and Debian's ``chromium`` on PATH; Playwright's own
browser download is never used. Without them the tests skip with the reason; with
KVLAB_REQUIRE_BROWSER=1 (set by .ci/run) they fail instead. They are the full tier (``-m full``; ``-m "full and not browser"`` leaves them out).
Cells marked ``# NBVAL_SKIP`` are skipped here as under nbval. The committed notebooks are never
written: autosave is off, and a test fails if its page sends any request that writes a file.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.full, pytest.mark.browser]  # the full tier: pytest -m full (README, .ci/run)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# Bounded waits, in seconds. A notebook runs in about a minute on 2 cores; these leave room for a
# busy CI machine without letting a hung kernel stall the suite.
SERVER_START_S = 120
PAGE_READY_S = 180
RUN_ALL_S = 420
BUTTON_S = 240

# JupyterLab settings for the test server only: never autosave the committed notebooks, render
# every cell (so the DOM holds every output), no news pop-up in the screenshots.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


def missing_tools(frontend: str | None = "jupyterlab") -> str | None:
    """Why the browser tests cannot run here, or None when they can (``frontend``: a module they also need)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install -r requirements.txt)"
    if frontend is not None:
        try:
            __import__(frontend)
        except ImportError:
            return f"{frontend} is not installed (pip install -r requirements.txt)"
    if shutil.which("chromium") is None:
        return ("no `chromium` on PATH: the browser tests drive a real Chromium "
                "(Debian/Ubuntu: sudo apt-get install chromium)")
    return None


def require_tools(reason: str | None) -> None:
    """Skip for ``reason``, or fail instead when KVLAB_REQUIRE_BROWSER=1 (CI); nothing when it is None."""
    if reason is None:
        return
    if os.environ.get("KVLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"KVLAB_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tools() -> None:
    require_tools(missing_tools())


@dataclass
class JupyterServer:
    """A Jupyter server this test started: its address, its token, its log (JupyterLab here, Notebook 6 in
    tests/test_browser_classic.py)."""

    url: str
    token: str
    log: Path

    def get(self, path: str) -> bytes:
        req = urllib.request.Request(f"{self.url}{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read()

    def api(self, method: str, path: str) -> object:
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def shutdown_sessions(self) -> None:
        """Shut down every kernel this server started (one notebook's session per test)."""
        for session in self.api("GET", "/api/sessions") or []:
            self.api("DELETE", f"/api/sessions/{session['id']}")

    def start(self, cmd: list, cwd: Path, env: dict, what: str) -> subprocess.Popen:
        """Launch the server (its output to ``self.log``) and wait until it answers, at most SERVER_START_S."""
        with open(self.log, "wb") as out:
            proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{what} exited with code {proc.returncode} before answering:\n{self.log_tail()}")
            try:
                self.api("GET", "/api/status")
                return proc
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    proc.terminate()
                    pytest.fail(f"{what} did not answer within {SERVER_START_S} s:\n{self.log_tail()}")
                time.sleep(0.5)

    def stop(self, proc: subprocess.Popen) -> None:
        """Shut down its kernels, then the server process (bounded waits)."""
        try:
            self.shutdown_sessions()
        except (urllib.error.URLError, OSError):
            pass
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tools, tmp_path_factory) -> JupyterServer:
    """One JupyterLab server for the whole session, on 127.0.0.1 with a free port and a token."""
    home = tmp_path_factory.mktemp("jupyter")
    settings = home / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "PYTHONUNBUFFERED": "1"}
    token, port = secrets.token_hex(16), free_port()
    log = home / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.port_retries=0",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={token}", f"--ServerApp.root_dir={ROOT}",
           "--allow-root", "--LabApp.expose_app_in_browser=True",
           f"--FileCheckpoints.checkpoint_dir={home / 'checkpoints'}"]  # not .ipynb_checkpoints/ in the repo
    server = JupyterServer(f"http://127.0.0.1:{port}", token, log)
    proc = server.start(cmd, ROOT, env, "JupyterLab")
    yield server
    server.stop(proc)


@pytest.fixture(scope="module")
def browser(tools):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


# --- JavaScript run inside JupyterLab (window.jupyterapp, exposed by --LabApp.expose_app_in_browser) ---

NOTEBOOK_READY = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!w || !w.content || !w.context || !w.context.isReady || !w.sessionContext) return false;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && w.content.widgets.length > 0;
}"""

# Clear the saved outputs (so every figure found later was drawn now), count the kernel's busy
# messages, then run every cell; cells holding NBVAL_SKIP are left out, as under nbval.
START_RUN = """async () => {
  const app = window.jupyterapp, w = app.shell.currentWidget, nb = w.content;
  const kernel = w.sessionContext.session.kernel;
  window.__kvlab = {done: false, ok: null, error: null, busy: 0};
  kernel.statusChanged.connect((_, s) => { if (s === 'busy') window.__kvlab.busy += 1; });
  await app.commands.execute('notebook:clear-all-cell-outputs');
  const cells = [...Array(nb.model.cells.length).keys()].map(i => nb.model.cells.get(i));
  const skip = cells.some(c => c.sharedModel.getSource().includes('NBVAL_SKIP'));
  const run = async () => {
    if (!skip) return await app.commands.execute('notebook:run-all-cells');
    let ok = true;
    for (let i = 0; i < cells.length; i++) {
      if (cells[i].type !== 'code' || cells[i].sharedModel.getSource().includes('NBVAL_SKIP')) continue;
      nb.activeCellIndex = i;
      nb.deselectAll();
      ok = (await app.commands.execute('notebook:run-cell')) && ok;
      if (!ok) break;
    }
    return ok;
  };
  run().then(ok => { window.__kvlab.ok = ok; window.__kvlab.done = true; })
       .catch(e => { window.__kvlab.error = String(e); window.__kvlab.done = true; });
  return skip;
}"""

RUN_DONE = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return window.__kvlab.done && !!k && k.status === 'idle';
}"""

BUSY_COUNT = "() => window.__kvlab.busy"

IDLE_AFTER = """([before, index]) => {
  const w = window.jupyterapp.shell.currentWidget;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  const button = document.querySelectorAll('.kvlab-run')[index];
  return window.__kvlab.busy > before && !!k && k.status === 'idle' && !!button && !button.disabled;
}"""

# What the notebook model holds after the run: error outputs per cell (with the cell's first line).
MODEL_ERRORS = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content, found = [];
  for (let i = 0; i < nb.model.cells.length; i++) {
    const c = nb.model.cells.get(i);
    if (c.type !== 'code' || c.sharedModel.getSource().includes('NBVAL_RAISES_EXCEPTION')) continue;
    for (let j = 0; j < c.outputs.length; j++) {
      const o = c.outputs.get(j).toJSON();
      if (o.output_type === 'error') found.push(`cell ${i} (${c.sharedModel.getSource().split('\\n')[0]}): `
                                               + `${o.ename}: ${o.evalue}`);
    }
  }
  return found;
}"""

UNEXECUTED = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content, left = [];
  for (let i = 0; i < nb.model.cells.length; i++) {
    const c = nb.model.cells.get(i);
    if (c.type === 'code' && c.executionCount === null && !c.sharedModel.getSource().includes('NBVAL_SKIP'))
      left.push(i);
  }
  return left;
}"""

PANELS = """() => [...document.querySelectorAll('.kvlab-panel')].map(p => {
  const out = p.querySelector('.kvlab-output');
  return {images: out ? out.querySelectorAll('img').length : 0,
          outputs: out ? out.querySelectorAll('.jp-OutputArea-output').length : 0,
          errors: [...p.querySelectorAll('.kvlab-error')].map(e => e.textContent),
          status: (p.querySelector('.kvlab-status') || {textContent: ''}).textContent};
})"""

# The folds that hide a prediction's answer (and the checks that would give it away) until the learner
# predicts or clicks: kvlab.lessons.common.predict's Comparison and verdicts(..., after=guess).
REVEALS = """() => [...document.querySelectorAll('.jp-OutputArea-output details.kvlab-reveal')].map(d => {
  const measured = d.querySelector('.kvlab-measured');
  return {open: d.open, summary: d.querySelector('summary').innerText, shown: d.innerText,
          measured: measured ? measured.textContent : null};
})"""

# The notebook scrolls inside JupyterLab's layout, so a full-page screenshot needs a viewport as
# tall as the notebook's content (plus the menus and status bar around it).
NOTEBOOK_HEIGHT = """() => {
  const panel = window.jupyterapp.shell.currentWidget.node;
  const outer = panel.querySelector('.jp-WindowedPanel-outer') || panel.querySelector('.jp-Notebook');
  outer.scrollTop = 0;
  return outer.scrollHeight + (window.innerHeight - outer.clientHeight);
}"""


def full_page_screenshot(page, height: float, name: str) -> float:
    """A screenshot of the whole notebook (``height`` px tall, capped) in test-artifacts/screenshots/NAME."""
    page.set_viewport_size({"width": 1280, "height": max(900, min(int(height) + 20, 16000))})
    page.wait_for_timeout(500)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)
    return height


def record_timing(name: str, timings: dict, file: str = "browser-timings.json") -> None:
    path = ARTIFACTS / file
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = timings
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_a_real_browser(notebook: Path, lab: JupyterServer, browser) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    saved = notebook.read_bytes()
    rel = notebook.relative_to(ROOT).as_posix()
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    console_errors: list[str] = []
    page.on("pageerror", lambda exc: console_errors.append(str(exc)))
    writes: list[str] = []  # requests of this page that would change a file on disk
    page.on("request", lambda r: writes.append(f"{r.method} {r.url.split('?')[0]}")
            if r.method in ("PUT", "PATCH", "POST", "DELETE") and "/api/contents/" in r.url
            and "/checkpoints" not in r.url else None)  # checkpoints go to a temporary folder

    def waited(what: str, js: str, timeout_s: float, arg=None) -> None:
        try:
            page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000, polling=250)
        except PlaywrightTimeout:
            pytest.fail(f"{rel}: {what} did not happen within {timeout_s:.0f} s\n"
                        f"page errors: {console_errors[-5:]}\nserver log:\n{lab.log_tail(15)}")

    try:
        workspace = f"kvlab-{notebook.stem}"
        page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{rel}?reset&token={lab.token}",
                  timeout=PAGE_READY_S * 1000)
        waited("the notebook opening with an idle kernel", NOTEBOOK_READY, PAGE_READY_S)
        # More room for the notebook in the screenshot; and every Going deeper section opened (they are saved
        # folded, kvlab.reading), so its panels are on screen to press, as for a learner who opens them all.
        for command in ("application:toggle-left-area", "notebook:expand-all-headings"):
            page.evaluate("c => window.jupyterapp.commands.execute(c).catch(() => null)", command)
        timings["open_s"] = time.monotonic() - t0

        t = time.monotonic()
        page.evaluate(START_RUN)
        waited("running every cell (Run All)", RUN_DONE, RUN_ALL_S)
        timings["run_all_s"] = time.monotonic() - t
        state = page.evaluate("() => window.__kvlab")
        errors = page.evaluate(MODEL_ERRORS)
        assert not errors, f"{rel}: error output after Run All:\n" + "\n".join(errors)
        assert state["error"] is None, f"{rel}: Run All failed in JupyterLab: {state['error']}"
        assert state["ok"], f"{rel}: Run All stopped early (a cell failed)"
        assert page.evaluate(UNEXECUTED) == [], f"{rel}: cells left unexecuted after Run All"

        # Run All without a prediction: no answer on screen until the learner clicks its fold.
        reveals = page.evaluate(REVEALS)
        answers = [r for r in reveals if r["measured"] is not None]
        assert answers, f"{rel}: no folded prediction answer after Run All (guess.against(...) with an empty box)"
        for r in reveals:
            assert not r["open"] and not any(ch.isdigit() for ch in r["summary"]), f"{rel}: fold shown open: {r}"
        assert all(r["measured"] not in r["shown"] for r in answers), f"{rel}: a measured answer is on screen: {answers}"
        fold = page.locator(".jp-OutputArea-output .kvlab-prediction details.kvlab-reveal").first
        fold.locator("summary").click()
        measured = fold.locator(".kvlab-measured")
        measured.wait_for(state="visible", timeout=10_000)
        assert any(ch.isdigit() for ch in measured.inner_text()), f"{rel}: the revealed answer holds no number"

        t = time.monotonic()
        buttons = page.locator(".kvlab-run")
        assert buttons.count() > 0, (f"{rel}: no Run button; every notebook runs its experiment behind one "
                                     "(kvlab.lessons.common.panel.ExperimentPanel)")
        for i in range(buttons.count()):
            before = page.evaluate(BUSY_COUNT)
            buttons.nth(i).scroll_into_view_if_needed()
            buttons.nth(i).click()
            waited(f"Run button {i + 1} finishing", IDLE_AFTER, BUTTON_S, arg=[before, i])
        timings["buttons_s"] = time.monotonic() - t

        figures = page.locator(".jp-OutputArea-output img").count()
        shown_errors = page.locator("[data-mime-type='application/vnd.jupyter.error']").count()
        panels = page.evaluate(PANELS)
        errors = page.evaluate(MODEL_ERRORS)

        height = full_page_screenshot(page, page.evaluate(NOTEBOOK_HEIGHT), f"{notebook.stem}.png")
        timings["total_s"] = time.monotonic() - t0
        timings.update(figures=figures, panels=len(panels), page_height_px=height)
        record_timing(notebook.stem, timings)

        assert not errors and shown_errors == 0, f"{rel}: error output shown after pressing Run:\n{errors}"
        assert figures > 0, f"{rel}: no figure on screen after Run All and Run"
        for i, panel in enumerate(panels):
            assert not panel["errors"], f"{rel}: panel {i + 1} shows an error: {panel['errors']}"
            assert panel["outputs"] > 0, f"{rel}: panel {i + 1} shows no result after Run ({panel['status']!r})"
        assert not console_errors, f"{rel}: JavaScript errors in the page: {console_errors[:5]}"
    finally:
        context.close()
        try:
            lab.shutdown_sessions()
        except (urllib.error.URLError, OSError):
            pass
        # JupyterLab must never save the test's run into the committed notebook. Only undo a write
        # this page made: in a shared checkout someone may regenerate the notebook meanwhile.
        if writes:
            if notebook.read_bytes() != saved:
                notebook.write_bytes(saved)
            pytest.fail(f"{rel}: JupyterLab wrote to disk during the test ({writes[:3]}); file restored")
