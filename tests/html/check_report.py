#!/usr/bin/env python3
"""Opens a report.html in headless Chromium with the network cut and checks it.

    python3 tests/html/check_report.py out/report.html \
        [--expect BOTTLENECK_NAME] [--screenshot target/test-artifacts/report.png]

Checks: no console errors or uncaught exceptions (the page's and the
flamegraph frames'), no request leaves the file (every request is the file
itself, about:srcdoc or data:), the verdict and the bottleneck's name are
visible in the DOM text, and a click on a frame of the cpu flamegraph zooms
it (checked through the DOM: the clicked frame's width becomes 100%). Saves
a full-page PNG screenshot.

Talks the DevTools protocol over --remote-debugging-pipe (NUL-separated JSON
on file descriptors 3 and 4), so it needs only Python's standard library
and Debian's `chromium` (scripts/setup.sh installs it). Exit status 0: all
checks passed; 1: a check failed; 2: Chromium could not be run. Importable:
`check(path, expect=None, screenshot=None)` returns the list of failures.
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
TIMEOUT_S = 60


class Cdp:
    """A DevTools session over the pipe: commands by id, events queued."""

    def __init__(self, proc, to_chrome, from_chrome):
        self.proc = proc
        self.w = to_chrome
        self.r = from_chrome
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read_message(self, deadline):
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self.r, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=None, timeout=TIMEOUT_S):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method, timeout=TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))

    def drain(self, seconds):
        """Collects events for `seconds` (console messages arrive late)."""
        end = time.monotonic() + seconds
        import select

        while time.monotonic() < end:
            ready, _, _ = select.select([self.r], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                break
            chunk = os.read(self.r, 1 << 16)
            if not chunk:
                break
            self.buf += chunk
            while b"\0" in self.buf:
                msg, self.buf = self.buf.split(b"\0", 1)
                self.events.append(json.loads(msg))


def find_chromium():
    for name in CHROMIUM_CANDIDATES:
        p = shutil.which(name)
        if p:
            return p
    return None


def launch(profile):
    exe = find_chromium()
    if not exe:
        raise FileNotFoundError("no chromium on PATH (scripts/setup.sh installs it)")
    # fd 3: Chromium reads commands; fd 4: it writes answers and events.
    cmd_r, cmd_w = os.pipe()
    ans_r, ans_w = os.pipe()
    args = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        # Cut the network: any request would go to a closed local port or
        # fail to resolve.
        "--proxy-server=127.0.0.1:9",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={profile}",
        "--remote-debugging-pipe",
        "about:blank",
    ]

    def fds():
        # Through spare descriptors, in case a pipe end already is 3 or 4;
        # dup2 leaves 3 and 4 inheritable.
        r, w = os.dup(cmd_r), os.dup(ans_w)
        os.dup2(r, 3)
        os.dup2(w, 4)

    # close_fds=False: subprocess would close fds 3 and 4 after preexec_fn;
    # Python's own descriptors are not inheritable, so nothing else leaks.
    proc = subprocess.Popen(
        args,
        close_fds=False,
        preexec_fn=fds,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    os.close(cmd_r)
    os.close(ans_w)
    return Cdp(proc, cmd_w, ans_r)


# Runs in the page: what the checks look at.
PAGE_STATE_JS = """
(() => {
  const v = document.getElementById('verdict');
  const frames = Array.from(document.querySelectorAll('iframe.flame'));
  const ready = frames.every(f => {
    const d = f.contentDocument;
    return d && d.getElementById('frames') && typeof f.contentWindow.zoom === 'function'
      && d.getElementById('unzoom') && f.contentWindow.plumberStarted === true;
  });
  return JSON.stringify({
    verdict: v ? v.innerText : '',
    bodyText: document.body.innerText.length,
    frames: frames.length,
    ready: ready,
  });
})()
"""

# A copy of the first graph loaded into a hidden frame (a background tab,
# a page still laying out), shown 0.5 s later: it must then fit the frame,
# with no negative width on the way.
HIDDEN_START_JS = """
(() => {
  const f = document.querySelector('iframe.flame');
  const g = document.createElement('iframe');
  g.id = 'hidden-start';
  g.style.display = 'none';
  g.style.width = '800px';
  document.body.appendChild(g);
  g.srcdoc = JSON.parse(document.getElementById(f.getAttribute('data-src')).textContent);
  setTimeout(() => { g.style.display = 'block'; }, 500);
  return '{}';
})()
"""
HIDDEN_STATE_JS = """
(() => {
  const g = document.getElementById('hidden-start');
  const w = g && g.contentWindow;
  const fr = w && w.document.getElementById('frames');
  const r = JSON.stringify({
    started: !!(w && w.plumberStarted),
    width: fr ? parseFloat(fr.getAttribute('width')) : null,
    // inferno's 2 x 10 px padding off the frame's inner width.
    fits: w ? w.document.documentElement.clientWidth - 20 : null,
  });
  return r;
})()
"""

# Clicks the widest frame of the cpu graph that is neither the root ("all")
# nor already full width, and reports its width before and after.
ZOOM_JS = """
(() => {
  const f = document.querySelector('iframe.flame[data-kind="cpu"]') ||
            document.querySelector('iframe.flame');
  if (!f) return JSON.stringify({error: 'no flamegraph frame'});
  const d = f.contentDocument;
  const gs = Array.from(d.querySelectorAll('#frames > g'));
  let pick = null, best = -1;
  for (const g of gs) {
    const r = g.querySelector('rect');
    const w = parseFloat(r.getAttribute('width'));
    if (w < 99.9 && w > best) { best = w; pick = g; }
  }
  if (!pick) return JSON.stringify({error: 'no frame narrower than the graph'});
  const rect = pick.querySelector('rect');
  const before = rect.getAttribute('width');
  pick.dispatchEvent(new f.contentWindow.MouseEvent('click', {bubbles: true, cancelable: true}));
  const after = rect.getAttribute('width');
  const unzoom = d.getElementById('unzoom');
  return JSON.stringify({
    name: pick.querySelector('title').textContent,
    before: before, after: after,
    unzoomShown: !unzoom.classList.contains('hide'),
    hidden: d.querySelectorAll('#frames > g.hide').length,
  });
})()
"""


# Clicks the bottleneck row's "stacks" button (the op filter); the frames
# answer by message and the page writes what they showed next to each graph.
FILTER_JS = """
(() => {
  const b = document.querySelector('tr.bottleneck button.stacks') ||
            document.querySelector('button.stacks');
  if (!b) return JSON.stringify({error: 'no stacks button'});
  b.click();
  return JSON.stringify({root: b.getAttribute('data-root')});
})()
"""

# Clicks the op table's "#" header twice (descending rank) and returns the
# first column before and after.
SORT_JS = """
(() => {
  const t = document.querySelector('table.ops');
  if (!t) return JSON.stringify({error: 'no op table'});
  const col = () => Array.from(t.tBodies[0].rows).map(r => r.cells[0].textContent);
  const before = col();
  const th = t.tHead.rows[0].cells[0];
  th.click(); th.click();
  return JSON.stringify({before: before, after: col()});
})()
"""

FILTER_STATUS_JS = """
JSON.stringify(Array.from(document.querySelectorAll('figure.flame .status')).map(s => s.textContent))
"""


def evaluate(cdp, session, expr):
    res = cdp.send("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session)
    if "exceptionDetails" in res:
        raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
    return json.loads(res["result"]["value"])


def console_errors(events):
    errs = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            errs.append("exception: " + d.get("exception", {}).get("description", d.get("text", "?")))
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errs.append("console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errs.append("log: " + p["entry"].get("text", ""))
    return errs


def outside_requests(events, page_url):
    bad = []
    for e in events:
        if e.get("method") != "Network.requestWillBeSent":
            continue
        url = e["params"]["request"]["url"]
        if url == page_url or url.startswith(("data:", "about:")):
            continue
        bad.append(url)
    return bad


def check(path, expect=None, screenshot=None, width=1280, max_height=16000, filter_finds=False):
    """Runs every check on the report at `path`; returns the failures."""
    path = os.path.abspath(path)
    url = "file://" + path
    failures = []
    with tempfile.TemporaryDirectory(prefix="plumber-chromium-") as profile:
        cdp = launch(profile)
        try:
            target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                cdp.send(f"{domain}.enable", session=session)
            cdp.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                session,
            )
            cdp.send("Page.navigate", {"url": url}, session)
            cdp.wait_event("Page.loadEventFired")
            # The flamegraphs load in their frames and lay out on a timer.
            state = {}
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                state = evaluate(cdp, session, PAGE_STATE_JS)
                if state["ready"]:
                    break
                time.sleep(0.2)
            if not state.get("ready"):
                failures.append(f"flamegraph frames not ready: {state}")
            verdict = state.get("verdict", "")
            if "Bottleneck".lower() not in verdict.lower():
                failures.append(f"no verdict visible: {verdict[:200]!r}")
            if expect and expect not in verdict:
                failures.append(f"bottleneck {expect!r} not in the verdict: {verdict[:200]!r}")
            srt = evaluate(cdp, session, SORT_JS)
            if "error" in srt:
                failures.append("sort: " + srt["error"])
            elif len(srt["before"]) > 1 and srt["after"][0] == srt["before"][0]:
                failures.append(f"sorting by rank did not reorder the op table: {srt}")
            else:
                # Back to rank order for the screenshot.
                evaluate(cdp, session, "document.querySelector('table.ops th').click(), '1'")
            if screenshot:
                m = cdp.send("Page.getLayoutMetrics", session=session)
                size = m.get("cssContentSize") or m["contentSize"]
                shot = cdp.send(
                    "Page.captureScreenshot",
                    {
                        "format": "png",
                        "captureBeyondViewport": True,
                        "clip": {"x": 0, "y": 0, "width": width, "height": min(size["height"], max_height), "scale": 1},
                    },
                    session,
                )
                os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
                with open(screenshot, "wb") as f:
                    f.write(base64.b64decode(shot["data"]))
                print("screenshot:", screenshot)
            if state.get("frames"):
                z = evaluate(cdp, session, ZOOM_JS)
                print("zoom:", json.dumps(z))
                if "error" in z:
                    failures.append("zoom: " + z["error"])
                elif not (z["before"] != z["after"] and abs(float(z["after"].rstrip("%")) - 100) < 0.01
                          and z["unzoomShown"]):
                    failures.append(f"click did not zoom: {z}")
                f = evaluate(cdp, session, FILTER_JS)
                statuses = []
                for _ in range(25):
                    statuses = evaluate(cdp, session, FILTER_STATUS_JS)
                    if statuses and all(statuses):
                        break
                    time.sleep(0.1)
                print("op filter:", json.dumps(f), json.dumps(statuses))
                if "error" in f or not statuses or not all(statuses):
                    failures.append(f"op filter: no answer from the flamegraphs: {f} {statuses}")
                elif filter_finds and not any(st.startswith("showing ") for st in statuses):
                    failures.append(f"op filter: no graph has the bottleneck's stacks: {f} {statuses}")
                evaluate(cdp, session, HIDDEN_START_JS)
                hidden = {}
                for _ in range(50):
                    time.sleep(0.1)
                    hidden = evaluate(cdp, session, HIDDEN_STATE_JS)
                    if hidden["started"] and hidden["width"] == hidden["fits"]:
                        break
                print("hidden start:", json.dumps(hidden))
                if not hidden["started"] or not hidden["width"] or hidden["width"] != hidden["fits"]:
                    failures.append(f"a graph started in a hidden frame does not fit it: {hidden}")
            cdp.drain(0.5)
            failures += console_errors(cdp.events)
            failures += [f"request outside the file: {u}" for u in outside_requests(cdp.events, url)]
        finally:
            try:
                cdp.send("Browser.close", timeout=5)
            except Exception:
                pass
            try:
                cdp.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                cdp.proc.kill()
                cdp.proc.wait()
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report", help="path of report.html")
    ap.add_argument("--expect", help="bottleneck name that must be in the verdict")
    ap.add_argument("--screenshot", help="where to write a full-page PNG")
    ap.add_argument("--max-height", type=int, default=16000, help="cut the screenshot at this many CSS pixels")
    ap.add_argument("--filter-finds", action="store_true",
                    help="the bottleneck's \"stacks\" button must find its stacks in some graph")
    args = ap.parse_args()
    try:
        failures = check(args.report, args.expect, args.screenshot, max_height=args.max_height,
                         filter_finds=args.filter_finds)
    except (FileNotFoundError, RuntimeError, TimeoutError) as e:
        print(f"check_report: cannot run Chromium: {e}", file=sys.stderr)
        return 2
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("ok:", args.report)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
