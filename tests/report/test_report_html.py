"""``compare --html``: one self-contained file, opened in a real headless browser (Debian's Chromium driven by
Playwright): it loads with no console or page error and no request leaving the file, shows every table and
figure (each image decoded), names every run's command, commit and device, and a screenshot is taken."""

import json
import shutil
from pathlib import Path

import pytest

from posbench.cli import main
from posbench.files import atomic_write_json

from tests.report.test_compare import bench_result, make_run

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (CI installs it with "
                                "'apt-get install -y chromium'); the HTML report is tested in a real browser")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]


def report_tree(root):
    def grid(v):
        return {"accuracy": {"metric": "accuracy", "higher_is_better": True,
                             "axes": [{"name": "len_a", "values": [1, 2]}, {"name": "len_b", "values": [1, 2]}],
                             "values": [[v, v / 2], [v / 3, 0.0]], "meta": {"unit": "%",
                                                                         "train_max": {"len_a": 1, "len_b": 1}}}}

    def curve(v):
        return {"ppl_chunks": {"metric": "perplexity", "higher_is_better": False,
                               "axes": [{"name": "length", "values": [256, 512, 1024]}],
                               "values": [v, v * 1.5, v * 3], "meta": {"train_max": {"length": 256}}}}
    loss = [[0, 3.0], [50, 2.0], [100, 1.5]]
    for seed in (0, 1):
        for enc, acc, ppl in (("rope", 40.0, 5.7), ("tape", 55.0, 5.5)):
            make_run(root, "arithmetic", enc, seed, {"accuracy": acc + seed}, grids=grid(acc + seed), loss=loss)
            make_run(root, "perplexity", enc, seed, {"ppl_1x": ppl + seed / 10, "ppl_4x": 3 * ppl},
                     grids=curve(ppl + seed / 10), loss=loss, hib={"ppl_1x": False, "ppl_4x": False})
    atomic_write_json(root / "bench" / "train" / "b1" / "result.json", bench_result())


def test_the_html_report_opens_offline_in_a_browser_with_every_table_and_figure(tmp_path, capsys):
    from playwright.sync_api import sync_playwright

    report_tree(tmp_path / "runs")
    page_file = tmp_path / "report.html"
    assert main(["compare", str(tmp_path / "runs"), "--against", "rope", "--html", str(page_file)]) == 0
    assert f"wrote {page_file}" in capsys.readouterr().err
    text = page_file.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text

    console_errors, page_errors, outside = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))

            def only_the_file(route):
                if route.request.url.startswith(("file:", "data:")):
                    route.continue_()
                else:
                    outside.append(route.request.url)
                    route.abort()
            page.route("**/*", only_the_file)
            page.goto(page_file.as_uri(), wait_until="load")
            tables = page.locator("table").count()
            images = page.evaluate("""() => Array.from(document.images).map(
                img => ({complete: img.complete, width: img.naturalWidth, height: img.naturalHeight}))""")
            headings = page.locator("h2").all_inner_texts()
            # every word of every table cell on one line (a path may break after a '/', a command between words)
            broken = page.evaluate("""() => {
                const out = [];
                for (const td of document.querySelectorAll("td")) {
                    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
                    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
                        for (const m of node.data.matchAll(/[^\\s\\/]+/g)) {
                            const range = document.createRange();
                            range.setStart(node, m.index);
                            range.setEnd(node, m.index + m[0].length);
                            const tops = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
                            if (tops.size > 1) out.push(m[0]);
                        }
                    }
                }
                return out;
            }""")
            body = page.inner_text("body")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()

    assert console_errors == [] and page_errors == [] and outside == []
    assert broken == []
    # arithmetic and perplexity: a metrics table and a difference table each, arithmetic's accuracy by length;
    # the bench run; provenance
    assert tables == 7
    assert [h.split(" ")[0] for h in headings] == ["arithmetic", "arithmetic:", "perplexity", "bench", "provenance"]
    assert "accuracy by the longer length, max(len_a, len_b)" in headings[1]
    # arithmetic: heatmaps and loss curves; perplexity: the curve and loss curves; bench: bars
    assert len(images) == 5 and all(i["complete"] and i["width"] > 0 and i["height"] > 0 for i in images)
    for needle in ("difference to rope", "posbench run -e tape", "abc123", "x86_64", "NVIDIA H100", "OOM",
                   "95% Student-t interval over seeds"):
        assert needle in body, needle
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    runs = json.loads(Path(tmp_path / "runs" / "bench" / "train" / "b1" / "result.json").read_text())
    assert runs["bench"]["device_name"] in body
