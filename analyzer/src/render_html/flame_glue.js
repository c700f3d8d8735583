// Runs in each flamegraph's srcdoc document, before inferno's own script.
(function () {
  "use strict";
  // inferno keeps its zoom and search state in the URL with replaceState;
  // an about:srcdoc document cannot take a "?x=..." URL (SecurityError).
  // The state then lives only in the page, which is all we need.
  var replace = history.replaceState.bind(history);
  history.replaceState = function (a, b, c) {
    try { replace(a, b, c); } catch (e) { /* about:srcdoc: nothing to keep */ }
  };
  // inferno fits the graph to the frame's width when it starts (a timer
  // after the SVG's load) and on each resize, as that width less 20 px. A
  // frame not laid out yet (hidden, or its page still loading on a busy
  // machine) is 0 px wide: the graph would get width -20 (Chromium logs an
  // error) and stay broken until the next resize. So inferno starts once
  // the frame has a width (the SVG's onload calls plumberInit, not init),
  // and a resize to no width is not passed on to it.
  function wide() { return document.documentElement.clientWidth > 40; }
  window.plumberStarted = false;
  var pending = null;
  function start() {
    if (pending === null || !wide()) return;
    var evt = pending;
    pending = null;
    window.init(evt);
    // inferno fits the graph on a 0 ms timer of its own: started after it.
    setTimeout(function () { window.plumberStarted = true; }, 0);
  }
  window.plumberInit = function (evt) {
    pending = evt;
    start();
    // A hidden frame gets a resize when it is shown; the timer covers a
    // browser that sends none.
    (function poll() { if (pending !== null) { start(); setTimeout(poll, 100); } })();
  };
  window.addEventListener("resize", function (e) {
    if (!wide()) { e.stopImmediatePropagation(); return; }
    start();
  });
  // The frame group whose function name is exactly `name` (an op's root
  // frame, e.g. "[ParallelMapV2]"), lowest row first.
  function frameNamed(name) {
    var frames = document.getElementById("frames");
    if (!frames) return null;
    var best = null, bestY = -1;
    for (var i = 0; i < frames.children.length; i++) {
      var g = frames.children[i];
      var t = g.querySelector("title"), r = g.querySelector("rect");
      if (!t || !r) continue;
      var text = t.textContent;
      if (text.lastIndexOf(name + " (", 0) !== 0) continue;
      var y = parseFloat(r.getAttribute("y"));
      if (y > bestY) { best = g; bestY = y; }
    }
    return best;
  }
  function reply(msg) {
    msg.frame = window.frameElement ? window.frameElement.id : "";
    if (window.parent !== window) window.parent.postMessage(msg, "*");
  }
  window.addEventListener("message", function (e) {
    var d = e.data || {};
    // inferno's functions are globals of this document (zoom, unzoom,
    // search, search_prompt, searching); absent until its script ran, and
    // of no use until its init did.
    if (typeof window.zoom !== "function" || !window.plumberStarted) return;
    if (typeof d.op === "string") {
      window.unzoom();
      if (!d.op) { reply({ op: "", found: true }); return; }
      var g = frameNamed(d.op);
      if (g) window.zoom(g);
      reply({ op: d.op, found: !!g });
    } else if (typeof d.search === "string") {
      if (window.searching) window.search_prompt(); // resets the search
      var matched = true;
      if (d.search) {
        try { window.search(d.search); } catch (err) { matched = false; }
      }
      reply({ search: d.search, found: matched });
    }
  });
})();
