"""The built website, rendered in a real browser (headless Debian Chromium).

Run by `make test` after `make book` (marker `site`). Serves _build/html on 127.0.0.1 only and
checks, for each chapter in _toc.yml: the title, the code cells, that every figure loaded, that
MathJax typeset the math, that saved widgets rendered, that no raw LaTeX is left on the page, that no
code or output block is wider than the text column, and that the browser console logged no error
(a script error or a failed request such as a 404 fails the test, on every page).
"""
from __future__ import annotations

import functools
import http.server
import re
import shutil
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"

pytestmark = pytest.mark.site


def chapter_pages() -> list[str]:
    return [line.split("file:")[1].strip() for line in (ROOT / "_toc.yml").read_text().splitlines() if "file: chapters/" in line]


@pytest.fixture(scope="module")
def server():
    if not (HTML / "index.html").exists():
        pytest.fail("the site is not built: run `make book` first")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.fail("headless Chromium is missing: `apt-get install chromium chromium-driver` (.ci/run does this)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--no-first-run", "--window-size=1280,2000"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


def wait_for_mathjax(drv) -> None:
    drv.set_script_timeout(60)
    drv.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const go = () => window.MathJax && MathJax.startup && MathJax.startup.promise"
        "  ? MathJax.startup.promise.then(() => done(true)) : setTimeout(go, 100);"
        "go();"
    )


def console_errors(drv) -> list[str]:
    """Severe browser-console entries since the last call (uncaught errors, console.error, failed loads)."""
    return [entry["message"] for entry in drv.get_log("browser") if entry["level"] == "SEVERE"]


def load(drv, url: str) -> None:
    """Open a page and wait until MathJax and the widget manager (which renders on window load) are done."""
    console_errors(drv)  # drop what earlier pages logged
    drv.get(url)
    if drv.execute_script("return !!document.querySelector('script[src*=\"mathjax/tex\"]')"):
        wait_for_mathjax(drv)
    drv.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const go = () => document.readyState === 'complete' ? setTimeout(() => done(true), 500) : setTimeout(go, 100);"
        "go();"
    )
    # every saved widget view has been rendered within 30 s
    rendered = drv.execute_async_script(
        "const done = arguments[arguments.length - 1], t0 = Date.now();"
        "const want = document.querySelectorAll('script[type=\"application/vnd.jupyter.widget-view+json\"]').length;"
        "const go = () => { const n = document.querySelectorAll('.widget-subarea > *').length;"
        "  n >= want || Date.now() - t0 > 30000 ? done([n, want]) : setTimeout(go, 100); };"
        "go();"
    )
    assert rendered[0] >= rendered[1], f"{rendered[0]} of {rendered[1]} saved widgets rendered on {url}"


# Every code or output block whose box sticks out of the text column, or whose text runs past its own
# box (a pre that scrolls sideways hides the end of its lines, e.g. a verdict's numbers).
OVERFLOW_JS = """
const col = document.querySelector('article.bd-article').getBoundingClientRect();
const out = [];
for (const el of document.querySelectorAll(
    'article div.cell div.cell_input pre, article div.cell div.cell_output pre,' +
    'article div.cell div.cell_output table, article div.cell div.cell_output > div.output')) {
  const r = el.getBoundingClientRect();
  if (r.width === 0) continue;
  const outside = r.left < col.left - 1 || r.right > col.right + 1;
  const hidden = el.tagName === 'PRE' && el.scrollWidth > el.clientWidth + 1;
  if (outside || hidden)
    out.push(`${el.tagName} ${Math.round(r.width)}px box, ${el.scrollWidth}px content, column ` +
             `${Math.round(col.width)}px: ${(el.innerText || '').slice(0, 60)}`);
}
return out;
"""


@pytest.mark.parametrize("page", chapter_pages())
def test_site_chapter_renders(server, browser, page):
    from selenium.webdriver.common.by import By

    load(browser, f"{server}/{page}.html")
    title = browser.find_element(By.CSS_SELECTOR, "article h1").text
    assert title and title[0].isdigit(), f"chapter title missing: {title!r}"
    assert browser.title.startswith(title.rstrip("#").strip()[:10])

    shown = browser.find_elements(By.CSS_SELECTOR, "article .reading-time")
    assert shown and re.match(r"Reading time: about \d+ minutes \([\d,]+ words", shown[0].text), \
        "no reading time under the chapter's title"
    code_cells = browser.find_elements(By.CSS_SELECTOR, "div.cell div.cell_input")
    outputs = browser.find_elements(By.CSS_SELECTOR, "div.cell div.cell_output")
    assert len(code_cells) >= 5 and len(outputs) >= 5

    images = browser.find_elements(By.CSS_SELECTOR, "article img")
    assert images, "no figures on the page"
    broken = [img.get_attribute("src") for img in images
              if not browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)]
    assert not broken, f"figures that did not load: {broken}"

    typeset = browser.find_elements(By.CSS_SELECTOR, "mjx-container")
    assert typeset, "MathJax typeset nothing"
    text = browser.find_element(By.CSS_SELECTOR, "article").text
    for raw in ("$$", "\\frac", "\\cdots", "\\begin{", "\\(", "\\["):
        assert raw not in text, f"raw LaTeX {raw!r} left on the page"
    if "application/vnd.jupyter.widget-view+json" in browser.page_source:
        # saved widget state must render through the vendored widget manager, with no network
        # (an anywidget-only page renders as div.jupyter-widgets-disconnected: no ipywidgets model to connect)
        assert browser.find_elements(By.CSS_SELECTOR, "[class*=jupyter-widgets]"), "widgets did not render"
    errors = browser.find_elements(By.CSS_SELECTOR, "mjx-merror, .output.error, div.output.traceback")
    assert not errors, "math or cell errors on the page"
    wide = browser.execute_script(OVERFLOW_JS)
    assert not wide, f"{len(wide)} code/output blocks wider than the text column:\n" + "\n".join(wide)
    logged = console_errors(browser)
    assert not logged, "browser console errors:\n" + "\n".join(logged)

    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / (Path(page).name + ".png")))


@pytest.mark.parametrize("page", ["intro", "claims_ledger", "references"])
def test_site_page_logs_no_console_error(server, browser, page):
    load(browser, f"{server}/{page}.html")
    logged = console_errors(browser)
    assert not logged, "browser console errors:\n" + "\n".join(logged)


EXPLORABLES = [("chapters/03_memory_tax", "sizing", "double-context"),
               ("chapters/05_online_softmax", "online-softmax", "next"),
               ("chapters/06_flash_attention", "tile-schedule", "next"),
               ("chapters/07_paged_attention", "paged-allocator", "next"),
               ("chapters/09_speculative_decoding", "speculation-cost", "k-up"),
               ("chapters/10_composed_stack", "frontier", "double-batch")]


@pytest.mark.parametrize("page, name, action", EXPLORABLES)
def test_site_explorable_responds_with_no_kernel_or_network(server, browser, page, name, action):
    """The anywidget explorables render from saved state and recompute in the page when a control is used."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    load(browser, f"{server}/{page}.html")
    widget = WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, f"[data-explorable={name}]"))[0]
    browser.execute_script("arguments[0].scrollIntoView()", widget)
    button = widget.find_element(By.CSS_SELECTOR, f"button[data-action={action}]")
    before = widget.text
    button.click()
    assert widget.text != before, f"clicking {action!r} did not change the {name} explorable"
    if name == "online-softmax":  # to the last tile: the one-pass sum equals the two-pass one
        while "All" not in widget.find_element(By.CSS_SELECTOR, ".status").text:
            button.click()
        diff = float(widget.text.split("difference ")[1].split(")")[0])
        assert diff < 1e-12
    elif name == "paged-allocator":  # to the end of the scenario: the page's tables equal PagedKVCache's
        for _ in range(20):
            button.click()
        assert widget.find_elements(By.CSS_SELECTOR, ".note.ok"), widget.text
    elif name == "tile-schedule":  # a whole program at a time to the end: every tile the schedule runs is done
        step = widget.find_element(By.CSS_SELECTOR, "button[data-action=next-program]")
        for _ in range(200):
            if "All" in widget.find_element(By.CSS_SELECTOR, ".status").text:
                break
            step.click()
        done = re.search(r"All (\d+) tiles done", widget.text)
        ran = re.search(r"(\d+) of (\d+) tiles run", widget.text)
        assert done and ran and done[1] == ran[1] and int(ran[1]) <= int(ran[2]), widget.text
    elif name == "speculation-cost":  # the page's speedup is the Python cost model's at the shown setting
        from minillm.explorables.speculation import speculation_cost

        status = widget.find_element(By.CSS_SELECTOR, ".status").text
        a, k, c, s = re.search(r"alpha = ([\d.]+), k = (\d+), c = ([\d.]+):.* a speedup of ([\d.]+)x", status).groups()
        assert abs(float(s) - speculation_cost(float(a), int(k), float(c))["speedup"]) < 0.006, status
    elif name == "frontier":  # doubling the batch doubles the requests at once
        count = lambda text: int(re.search(r"([\d,]+) request\(s\) at once", text)[1].replace(",", ""))  # noqa: E731
        assert count(widget.text) == 2 * count(before), widget.text
    else:  # doubling the context doubles the cache per sequence
        assert "64,000-token sequence" in widget.text
    # nothing came from outside the test server (no CDN, no kernel)
    origins = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
    assert set(origins) <= {server, "null"}, set(origins)
    logged = console_errors(browser)
    assert not logged, "browser console errors:\n" + "\n".join(logged)


def test_site_claims_ledger_links_every_row_to_its_chapter(server, browser):
    from selenium.webdriver.common.by import By

    load(browser, f"{server}/claims_ledger.html")
    rows = browser.find_elements(By.CSS_SELECTOR, "article table tbody tr")
    checked = [row for row in rows if row.find_elements(By.CSS_SELECTOR, "td a")]
    # the claims no chapter checks (with the reason, or "not yet checked") link to no chapter
    assert len(checked) >= 40 and len(checked) < len(rows)
    for row in checked:
        href = row.find_element(By.CSS_SELECTOR, "td a").get_attribute("href").split("#")[0]
        assert href.startswith(f"{server}/chapters/") and (HTML / href[len(server) + 1:]).exists(), href


def test_site_intro_lists_only_existing_chapters(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/intro.html")
    # each link as a path under the site's root (chapters/..., appendix/..., or a top-level page)
    links = {a.get_attribute("href").split("#")[0].removeprefix(server + "/")
             for a in browser.find_elements(By.CSS_SELECTOR, "nav.bd-links a")}
    expected = {p + ".html" for p in chapter_pages()}
    assert expected <= links
    for href in links:
        assert (HTML / href).exists(), href
