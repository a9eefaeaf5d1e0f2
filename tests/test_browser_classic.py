"""The notebooks' widgets under ipywidgets 7 (Colab's), in a real browser: classic Notebook 6.x + Chromium.

Colab ships ipywidgets 7.7.1 and renders its protocol with its own front end; JupyterLab 4 (what
tests/test_browser.py drives) renders only ipywidgets 8. The nearest front end that runs here is the
classic Jupyter Notebook 6.x with widgetsnbextension 3.6 (see ../shared/reference/colab.md), so:

1. the Colab twin (``colab_twin`` fixture, tests/colab_twin.py: Colab's package set + kvlab's wheel)
   is left as it is; an *overlay* venv on the same Python holds the classic front end in its own
   site-packages: ``notebook`` 6.5.7, ``widgetsnbextension`` 3.6.6 (3.6.10, Colab's, fails to render
   an ``Output`` widget in this front end), and setuptools (notebook 6 imports ``distutils``, gone
   from Python 3.12+). A ``.pth`` file appends the twin's site-packages after the overlay's own, so
   ipywidgets 7.7.1, kvlab and torch come from the twin and widgetsnbextension 3.6.6 from the overlay;
2. the server runs from the overlay on 127.0.0.1 (free port, token, no browser) with a temporary
   notebook folder holding *copies* of notebooks/ (the committed notebooks are never opened); its
   ``python3`` kernel is the twin's own interpreter, so cells run exactly on Colab's package set;
3. for each notebook in NOTEBOOKS: open it in headless Chromium (Debian's, never Playwright's
   download), clear the saved outputs, run every cell (``# NBVAL_SKIP`` cells left out, as under
   nbval), check the deterministic outputs (``# NBVAL_CHECK_OUTPUT``) against the saved ones as nbval would (this
   is the twin's one execution of each notebook), press every ``.kvlab-run`` button (ExperimentPanel), wait for the kernel to
   go idle, then assert: a ``.kvlab-panel`` is visible, each panel's status says done (or shown from
   the cache) and its output holds a result, every tqdm bar the kernel's panels made is drawn (a
   panel whose run reports no progress, an instant calculator, has none), there is no error output,
   no widget failed to render and no JavaScript error. The kernel itself is asked, through the
   page, what it runs (the twin's Python, ipywidgets 7, Colab's ipykernel) and which panels it made.
   A full-page screenshot goes to test-artifacts/screenshots/classic-NAME.png, the time of each phase
   to test-artifacts/browser-classic-timings.json, the browser console to
   test-artifacts/browser-classic-console/NAME.txt. The page reaches nothing but the server: any
   other request (the Colab and Binder badges in the markdown) is refused and logged there.

Skip/require policy as tests/test_browser.py: without Playwright for Python or ``chromium`` on PATH
the test skips with the reason; with KVLAB_REQUIRE_BROWSER=1 it fails instead; it is the full tier (``-m full``), and
``-m "full and not browser"`` leaves it out. It says nothing about Colab's
own renderer, which does not use widgetsnbextension's JavaScript; it shows that what kvlab sends
under ipywidgets 7 is a widget tree a 7.x front end draws and drives.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.full, pytest.mark.browser, pytest.mark.colab_twin]  # the full tier: pytest -m full (README, .ci/run)

from notebook_run import CHECK_OUTPUT, compare_outputs
from test_browser import (JupyterServer, browser, free_port, full_page_screenshot, missing_tools,  # noqa: F401
                          record_timing, require_tools)

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
CONSOLE_LOGS = ARTIFACTS / "browser-classic-console"
# Every notebook: each takes about a minute on 2 cores (see browser-classic-timings.json).
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# The classic front end, in the overlay's own site-packages (installed before the .pth exists, so pip
# never sees, and never touches, the twin's packages).
OVERLAY_PACKAGES = ("notebook==6.5.7", "widgetsnbextension==3.6.6", "setuptools==81.0.0")
WIDGETS_MAJOR = "7."
NBEXTENSION_VERSION = "3.6.6"
NBEXTENSION = "jupyter-js-widgets/extension"

PIP_S = 900
SERVER_START_S = 120
PAGE_READY_S = 180
RUN_ALL_S = 420
BUTTON_S = 240


@pytest.fixture(scope="session")
def tools() -> None:
    """Skip (or, with KVLAB_REQUIRE_BROWSER=1, fail) without the tools; session-scoped and asked for first by
    the test, so that a skip comes before the session-scoped twin is built."""
    require_tools(missing_tools(frontend=None))  # the classic front end comes with the overlay


def run(cmd: list, env: dict, timeout: float, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(map(str, cmd))} did not finish within {timeout:.0f} s")
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        out = "\n".join(line for line in out.splitlines() if not line.startswith("WARNING: Location"))
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{out[-5000:]}")
    return proc.stdout


@dataclass
class Overlay:
    venv: Path
    python: Path
    env: dict
    versions: dict  # what the overlay's interpreter imports, and from where


OVERLAY_CHECK = """
import importlib.metadata as md, json, sys
import ipywidgets, widgetsnbextension, notebook, kvlab
print(json.dumps({
    "python": sys.version.split()[0],
    "ipywidgets": ipywidgets.__version__, "ipywidgets_file": ipywidgets.__file__,
    "widgetsnbextension": md.version("widgetsnbextension"),
    "widgetsnbextension_module": widgetsnbextension.__version__,
    "widgetsnbextension_file": widgetsnbextension.__file__,
    "notebook": notebook.__version__, "notebook_file": notebook.__file__, "kvlab_file": kvlab.__file__,
}))
"""


@pytest.fixture(scope="module")
def overlay(tools, colab_twin, tmp_path_factory) -> Overlay:
    """A venv on the twin's Python: the classic front end in its own site-packages, the twin's after them."""
    root = tmp_path_factory.mktemp("classic-overlay")
    venv = root / "venv"
    run([colab_twin.python, "-m", "venv", venv], env=colab_twin.env, timeout=300, cwd=root)
    python = venv / "bin" / "python"
    env = {k: v for k, v in colab_twin.env.items() if k != "VIRTUAL_ENV"}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    run([python, "-m", "pip", "install", "-q", *OVERLAY_PACKAGES], env=env, timeout=PIP_S, cwd=root)
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       env=env, timeout=60).strip())
    twin_site = colab_twin.site_packages()
    (purelib / "kvlab-colab-twin.pth").write_text(f"{twin_site}\n")  # a plain path: appended after purelib

    versions = json.loads(run([python, "-c", OVERLAY_CHECK], env=env, timeout=120, cwd=root).strip().splitlines()[-1])
    assert versions["ipywidgets"].startswith(WIDGETS_MAJOR), f"overlay imports ipywidgets {versions['ipywidgets']}"
    assert Path(versions["ipywidgets_file"]).is_relative_to(twin_site), versions
    assert Path(versions["kvlab_file"]).is_relative_to(twin_site), versions
    assert versions["widgetsnbextension"] == versions["widgetsnbextension_module"] == NBEXTENSION_VERSION, versions
    assert Path(versions["widgetsnbextension_file"]).is_relative_to(purelib), versions
    assert versions["notebook"].startswith("6."), versions
    nbext = venv / "share" / "jupyter" / "nbextensions" / NBEXTENSION
    assert nbext.with_suffix(".js").is_file(), f"widgetsnbextension installed no {nbext}.js"
    enabled = venv / "etc" / "jupyter" / "nbconfig" / "notebook.d" / "widgetsnbextension.json"
    if not enabled.is_file():  # its wheel enables it; older builds needed this step
        run([venv / "bin" / "jupyter", "nbextension", "enable", "--py", "widgetsnbextension", "--sys-prefix"],
            env=env, timeout=120, cwd=root)
    return Overlay(venv, python, env, versions)


@dataclass
class Server(JupyterServer):
    folder: Path  # the notebook folder the server serves: copies of notebooks/


@pytest.fixture(scope="module")
def server(overlay, colab_twin, tmp_path_factory) -> Server:
    """The classic Notebook server of the overlay, on 127.0.0.1 with a free port and a token."""
    home = tmp_path_factory.mktemp("classic-jupyter")
    folder = home / "notebooks"
    shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    # The python3 kernel is the twin's own interpreter: cells run on Colab's package set exactly.
    spec = home / "data" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(colab_twin.python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (Colab twin)", "language": "python", "metadata": {"debugger": True}}))
    env = {**overlay.env, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "IPYTHONDIR": str(home / "ipython"),
           "JUPYTER_PREFER_ENV_PATH": "0",  # the kernelspec above wins over the overlay's ipykernel one
           "PYTHONUNBUFFERED": "1"}
    token, port = secrets.token_hex(16), free_port()
    log = home / "notebook.log"
    cmd = [overlay.python, "-m", "notebook", "--no-browser", f"--port={port}", "--NotebookApp.port_retries=0",
           "--NotebookApp.ip=127.0.0.1", f"--NotebookApp.token={token}", f"--NotebookApp.notebook_dir={folder}",
           "--allow-root", "--NotebookApp.open_browser=False"]
    srv = Server(f"http://127.0.0.1:{port}", token, log, folder)
    proc = srv.start(cmd, folder, env, "the classic Notebook server")
    try:
        # It serves the overlay's widgetsnbextension (3.6.6), enabled for the notebook page.
        served = srv.get(f"/nbextensions/{NBEXTENSION}.js")
        assert served == (overlay.venv / "share" / "jupyter" / "nbextensions" / f"{NBEXTENSION}.js").read_bytes(), \
            "the server serves another jupyter-js-widgets/extension.js than the overlay's widgetsnbextension"
        config = srv.api("GET", "/api/config/notebook")
        assert (config or {}).get("load_extensions", {}).get(NBEXTENSION) is True, \
            f"{NBEXTENSION} is not enabled for the notebook page: {config}"
        specs = srv.api("GET", "/api/kernelspecs")
        assert specs["kernelspecs"]["python3"]["spec"]["argv"][0] == str(colab_twin.python), specs
        yield srv
    finally:
        srv.stop(proc)


# --- JavaScript run in the classic notebook page (window.Jupyter) ---

# The notebook loaded, its kernel connected and idle, and the widget manager of jupyter-js-widgets
# attached to it (else the widgets' comm messages would find no one to build them).
NOTEBOOK_READY = """() => {
  const nb = window.Jupyter && window.Jupyter.notebook, k = nb && nb.kernel;
  const icon = document.querySelector('#kernel_indicator_icon');
  return !!(nb && nb._fully_loaded && k && k.is_connected() && k.widget_manager
            && icon && icon.classList.contains('kernel_idle_icon') && nb.get_cells().length > 0);
}"""

# Autosave off, kernel status counted, saved outputs cleared (so every output found later was made
# now), then every code cell run except those marked NBVAL_SKIP (as under nbval).
START_RUN = """() => {
  const nb = Jupyter.notebook;
  nb.set_autosave_interval(0);
  window.__kvlab = {busy: 0, status: 'idle'};
  nb.events.on('kernel_busy.Kernel', () => { window.__kvlab.busy += 1; window.__kvlab.status = 'busy'; });
  nb.events.on('kernel_idle.Kernel', () => { window.__kvlab.status = 'idle'; });
  nb.clear_all_output();
  const run = [];
  nb.get_cells().forEach((c, i) => {
    if (c.cell_type === 'code' && !c.get_text().includes('NBVAL_SKIP')) run.push(i);
  });
  nb.execute_cells(run);
  return run;
}"""

RUN_DONE = """() => window.__kvlab.busy > 0 && window.__kvlab.status === 'idle'
                 && document.querySelectorAll('.cell.running').length === 0"""

BUSY_COUNT = "() => window.__kvlab.busy"

IDLE_AFTER = """([before, index]) => {
  const button = document.querySelectorAll('.kvlab-run')[index];
  return window.__kvlab.busy > before && window.__kvlab.status === 'idle' && !!button && !button.disabled
         && document.querySelectorAll('.cell.running').length === 0;
}"""

# Error outputs in the notebook's model, per cell (with the cell's first line).
MODEL_ERRORS = """() => {
  const found = [];
  Jupyter.notebook.get_cells().forEach((c, i) => {
    if (c.cell_type !== 'code' || c.get_text().includes('NBVAL_RAISES_EXCEPTION')) return;
    for (const o of c.output_area.outputs)
      if (o.output_type === 'error') found.push(`cell ${i} (${c.get_text().split('\\n')[0]}): ${o.ename}: ${o.evalue}`);
  });
  return found;
}"""

UNEXECUTED = """indices => indices.filter(i => typeof Jupyter.notebook.get_cell(i).input_prompt_number !== 'number')"""
# The outputs of every code cell as the front end holds them (nbformat's JSON), before any Run button is pressed.
CODE_OUTPUTS = """() => Jupyter.notebook.get_cells().filter(c => c.cell_type === 'code').map(c => c.toJSON().outputs || [])"""

PANELS = """() => [...document.querySelectorAll('.kvlab-panel')].map(p => {
  const out = p.querySelector('.kvlab-output'), r = p.getBoundingClientRect();
  return {visible: r.width > 0 && r.height > 0 && getComputedStyle(p).visibility !== 'hidden',
          images: out ? out.querySelectorAll('img').length : 0,
          outputs: out ? out.querySelectorAll('.output_area').length : 0,
          buttons: p.querySelectorAll('button.jupyter-button.kvlab-run').length,
          bars: [...p.querySelectorAll('.widget-hprogress .progress-bar')]
                .filter(b => b.getBoundingClientRect().width > 0).length,
          errors: [...p.querySelectorAll('.kvlab-error')].map(e => e.textContent),
          status: (p.querySelector('.kvlab-status') || {textContent: ''}).textContent.trim()};
})"""

# Widget views that did not render: jupyter-js-widgets writes this text instead of the view.
UNRENDERED = """() => [...document.querySelectorAll('.output_subarea.jupyter-widgets-view')]
  .map(v => v.textContent).filter(t => t.includes('could not be displayed') || t.includes('Error rendering'))"""

# The notebook scrolls inside #site, so a full-page screenshot needs a viewport as tall as its content.
NOTEBOOK_HEIGHT = """() => {
  const site = document.querySelector('#site');
  site.scrollTop = 0;
  return site.scrollHeight + (window.innerHeight - site.clientHeight);
}"""

DONE_STATUS = ("done in", "shown from the cache")
STATUS_OF = """i => {
  const p = (document.querySelectorAll('.kvlab-run')[i] || {closest: () => null}).closest('.kvlab-panel');
  const s = p && p.querySelector('.kvlab-status');
  return s ? s.textContent.trim() : '';
}"""

# Run ``code`` in the page's kernel, outside the notebook (no cell, no history): {stdout, other output}.
KERNEL_EXEC = """code => new Promise(resolve => {
  const said = {stdout: '', other: []};
  setTimeout(() => { said.other.push('no idle within 60 s'); resolve(said); }, 60000);
  Jupyter.notebook.kernel.execute(code, {iopub: {
    output: m => { if (m.msg_type === 'stream' && m.content.name === 'stdout') said.stdout += m.content.text;
                   else said.other.push(JSON.stringify(m.content).slice(0, 500)); },
    status: m => { if (m.content.execution_state === 'idle') resolve(said); }}},
    {silent: false, store_history: false});
})"""

KERNEL_FACTS = """def _kvlab_browser_check():
    import json, sys, ipykernel, ipywidgets, kvlab
    print(json.dumps({"executable": sys.executable, "ipywidgets": ipywidgets.__version__,
                      "ipykernel": ipykernel.__version__, "kvlab": kvlab.__file__}))
_kvlab_browser_check()
del _kvlab_browser_check"""

# The kernel's ExperimentPanels: how many there are and how many made a tqdm bar (an instant
# calculator's run reports no progress, so it has none).
# (type(), not isinstance(): isinstance asks __class__, which a dead weak proxy answers with ReferenceError.)
KERNEL_PANELS = """def _kvlab_browser_check():
    import gc, json
    from kvlab.lessons.common.panel import ExperimentPanel
    panels = [o for o in gc.get_objects() if issubclass(type(o), ExperimentPanel)]
    print(json.dumps({"panels": len(panels), "with_bar": sum(p.progress_bar is not None for p in panels)}))
_kvlab_browser_check()
del _kvlab_browser_check"""



@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_widgets_under_ipywidgets7(tools, notebook: Path, server: Server, overlay: Overlay, colab_twin,
                                            browser) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    name = notebook.name
    copy = server.folder / name
    assert copy.is_file(), f"{name} was not copied to the server's folder"
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    console: list[str] = []
    page_errors: list[str] = []
    page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    # Loopback only: whatever else the page asks for (badges in the markdown) is refused here.
    local = server.url.rstrip("/")

    def only_local(route) -> None:
        if route.request.url.startswith(local + "/") or route.request.url == local:
            route.continue_()
        else:
            console.append(f"[blocked] {route.request.method} {route.request.url}")
            route.abort()

    context.route("**/*", only_local)

    def waited(what: str, js: str, timeout_s: float, arg=None) -> None:
        try:
            page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000, polling=250)
        except PlaywrightTimeout:
            pytest.fail(f"{name} (classic): {what} did not happen within {timeout_s:.0f} s\n"
                        f"page errors: {page_errors[-5:]}\nconsole: {console[-10:]}\n"
                        f"server log:\n{server.log_tail(15)}")

    def js_trouble() -> list[str]:
        return [f"[pageerror] {e}" for e in page_errors] + [m for m in console if m.startswith("[error]")]

    def kernel_json(code: str) -> dict:
        said = page.evaluate(KERNEL_EXEC, code)
        try:
            return json.loads(said["stdout"])
        except ValueError:
            pytest.fail(f"{name} (classic): the kernel answered {said!r} to:\n{code}")

    try:
        page.goto(f"{server.url}/notebooks/{name}?token={server.token}", timeout=PAGE_READY_S * 1000)
        waited("the notebook opening with an idle kernel and the widget manager", NOTEBOOK_READY, PAGE_READY_S)
        timings["open_s"] = time.monotonic() - t0
        facts = kernel_json(KERNEL_FACTS)
        assert facts["executable"] == str(colab_twin.python), f"the kernel runs {facts}, not the twin's Python"
        assert facts["ipywidgets"].startswith(WIDGETS_MAJOR), f"the kernel imports ipywidgets {facts}"
        assert facts["ipykernel"] == colab_twin.colab["ipykernel"], f"the kernel runs ipykernel {facts}"
        assert Path(facts["kvlab"]).is_relative_to(colab_twin.venv), f"the kernel imports kvlab from {facts}"

        t = time.monotonic()
        indices = page.evaluate(START_RUN)
        waited("running every cell", RUN_DONE, RUN_ALL_S)
        timings["run_all_s"] = time.monotonic() - t
        errors = page.evaluate(MODEL_ERRORS)
        assert not errors, f"{name} (classic): error output after running every cell:\n" + "\n".join(errors)
        assert page.evaluate(UNEXECUTED, indices) == [], f"{name} (classic): cells left unexecuted"
        # This run is the twin's execution of the notebook: its deterministic outputs are checked here too, as plain
        # text and streams (the front end hands HTML back re-serialised).
        saved = [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
        ran = page.evaluate(CODE_OUTPUTS)
        assert len(ran) == len(saved), f"{name} (classic): {len(ran)} code cells on the page, {len(saved)} saved"
        differ = [f"code cell {i}: " + "\n".join(problems) for i, (cell, outputs) in enumerate(zip(saved, ran))
                  if CHECK_OUTPUT in cell.source
                  and (problems := compare_outputs(cell.outputs, outputs, only=("text/plain",)))]
        assert not differ, f"{name} (classic, Colab's packages): deterministic outputs differ:\n" + "\n".join(differ)

        t = time.monotonic()
        buttons = page.locator(".kvlab-run")
        assert buttons.count() > 0, (f"{name} (classic): no .kvlab-run button rendered (ExperimentPanel); "
                                     f"JavaScript errors: {js_trouble()[:6]}")
        clicks = []
        for i in range(buttons.count()):
            before, status_before = page.evaluate(BUSY_COUNT), page.evaluate(STATUS_OF, i)
            buttons.nth(i).scroll_into_view_if_needed()
            buttons.nth(i).click()
            waited(f"Run button {i + 1} finishing", IDLE_AFTER, BUTTON_S, arg=[before, i])
            clicks.append((status_before, page.evaluate(STATUS_OF, i)))
        timings["buttons_s"] = time.monotonic() - t

        in_kernel = kernel_json(KERNEL_PANELS)
        page.wait_for_timeout(300)  # the last comm messages after idle
        panels = page.evaluate(PANELS)
        errors = page.evaluate(MODEL_ERRORS)
        shown_errors = page.locator(".output_subarea.output_error").count()
        unrendered = page.evaluate(UNRENDERED)
        figures = page.locator(".output_area img").count()

        height = full_page_screenshot(page, page.evaluate(NOTEBOOK_HEIGHT), f"classic-{notebook.stem}.png")
        timings["total_s"] = time.monotonic() - t0
        timings.update(figures=figures, panels=len(panels), page_height_px=height,
                       progress_bars=sum(p["bars"] for p in panels), kernel_panels=in_kernel)
        record_timing(notebook.stem, timings, "browser-classic-timings.json")

        assert not errors and shown_errors == 0, f"{name} (classic): error output after pressing Run:\n{errors}"
        assert not unrendered, f"{name} (classic): widgets not rendered: {unrendered[:3]}"
        assert panels, f"{name} (classic): no .kvlab-panel on the page"
        assert any(p["visible"] for p in panels), f"{name} (classic): no .kvlab-panel is visible"
        for i, panel in enumerate(panels):
            where = f"{name} (classic): panel {i + 1}"
            assert panel["visible"], f"{where} is not visible"
            assert panel["buttons"] == 1, f"{where} has {panel['buttons']} Run buttons rendered"
            assert not panel["errors"], f"{where} shows an error: {panel['errors']}"
            assert any(s in panel["status"] for s in DONE_STATUS), f"{where}: status {panel['status']!r} after Run"
            assert panel["outputs"] > 0, f"{where} shows no result after Run"
        for i, (status_before, status_after) in enumerate(clicks):
            # The click reached the panel's handler: a run says "done in", a cache hit says so (both new text).
            assert status_after != status_before or "from the cache" in status_after, \
                f"{name} (classic): pressing Run {i + 1} left its status at {status_before!r}"
        assert any(p["images"] for p in panels), f"{name} (classic): no panel shows a figure after Run"
        assert len(panels) == in_kernel["panels"], \
            f"{name} (classic): {len(panels)} panels drawn, the kernel made {in_kernel['panels']}"
        drawn_bars = sum(p["bars"] > 0 for p in panels)
        assert drawn_bars == in_kernel["with_bar"], \
            (f"{name} (classic): {drawn_bars} panels show a tqdm progress bar, but {in_kernel['with_bar']} "
             "of the kernel's panels made one")
        assert not page_errors, f"{name} (classic): JavaScript errors in the page: {page_errors[:5]}"
        widget_failures = [m for m in console if m.startswith("[error]") and
                           any(s in m for s in ("Could not", "widget", "Widget", "model"))]
        assert not widget_failures, f"{name} (classic): widget errors in the console: {widget_failures[:5]}"
    finally:
        CONSOLE_LOGS.mkdir(parents=True, exist_ok=True)
        lines = console + [f"[pageerror] {e}" for e in page_errors]
        (CONSOLE_LOGS / f"{notebook.stem}.txt").write_text("\n".join(lines) + "\n")
        context.close()
        try:
            server.shutdown_sessions()
        except (urllib.error.URLError, OSError):
            pass
