// report.html's script: sortable tables, the flamegraph frames (filled in
// from their JSON), and the op filter and search that talk to them.
(function () {
  "use strict";

  // Sorting: a cell's data-v is its sort value (a number, else text);
  // clicking a header again reverses the order.
  function sortTable(table, col, th) {
    var body = table.tBodies[0];
    if (!body) return;
    var desc = th.classList.contains("asc");
    var heads = table.tHead.rows[0].cells;
    for (var i = 0; i < heads.length; i++) heads[i].classList.remove("asc", "desc");
    th.classList.add(desc ? "desc" : "asc");
    var rows = Array.prototype.slice.call(body.rows);
    function key(row) {
      var c = row.cells[col];
      if (!c) return "";
      var v = c.hasAttribute("data-v") ? c.getAttribute("data-v") : c.textContent.trim();
      var n = parseFloat(v);
      return isNaN(n) ? v.toLowerCase() : n;
    }
    var keyed = rows.map(function (r, i) { return { r: r, k: key(r), i: i }; });
    keyed.sort(function (a, b) {
      var x = a.k, y = b.k, c;
      if (typeof x === "number" && typeof y === "number") c = x - y;
      else c = String(x) < String(y) ? -1 : String(x) > String(y) ? 1 : 0;
      if (c !== c) c = 0; // Infinity - Infinity
      return (desc ? -c : c) || a.i - b.i;
    });
    keyed.forEach(function (e) { body.appendChild(e.r); });
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    if (!table.tHead) return;
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.addEventListener("click", function () { sortTable(table, col, th); });
    });
  });

  // Flamegraphs: each iframe's document is the JSON string next to it.
  var frames = Array.prototype.slice.call(document.querySelectorAll("iframe.flame"));
  frames.forEach(function (f) {
    var src = document.getElementById(f.getAttribute("data-src"));
    if (!src) return;
    try { f.srcdoc = JSON.parse(src.textContent); } catch (e) { f.srcdoc = "<p>flamegraph unreadable</p>"; }
  });
  function post(msg) {
    frames.forEach(function (f) { if (f.contentWindow) f.contentWindow.postMessage(msg, "*"); });
  }
  window.addEventListener("message", function (e) {
    var d = e.data || {};
    if (!d.frame) return;
    var i = d.frame.replace("flame-", "");
    var status = document.getElementById("flame-status-" + i);
    if (!status) return;
    if (typeof d.op === "string") {
      status.textContent = d.op ? (d.found ? "showing " + d.op + " only" : d.op + " has no stacks here") : "";
    } else if (typeof d.search === "string") {
      status.textContent = d.search && !d.found ? "not a valid regexp" : "";
    }
  });
  var filter = document.getElementById("op-filter");
  if (filter) filter.addEventListener("change", function () { post({ op: filter.value }); });
  var search = document.getElementById("flame-search");
  if (search) search.addEventListener("change", function () { post({ search: search.value }); });

  // "stacks" in the op table: pick that op in the filter and go to the graphs.
  document.querySelectorAll("button.stacks").forEach(function (b) {
    b.addEventListener("click", function () {
      if (!filter) return;
      var root = b.getAttribute("data-root");
      var has = Array.prototype.some.call(filter.options, function (o) { return o.value === root; });
      if (!has) {
        var o = document.createElement("option");
        o.value = root; o.textContent = root;
        filter.appendChild(o);
      }
      filter.value = root;
      post({ op: root });
      var st = document.getElementById("stacks");
      if (st) st.scrollIntoView();
    });
  });
})();
