// The console's one script: it refreshes the endpoints table every two
// seconds from /api/stats (writing text only, never HTML), and ticks every
// box of the dead-letter list when the header's box is ticked.
"use strict";
(function () {
  function refresh() {
    fetch("/api/stats", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (rows) {
        if (!rows) { return; }
        rows.forEach(function (row) {
          document.querySelectorAll("#endpoints tr[data-endpoint]").forEach(function (tr) {
            if (tr.dataset.endpoint !== row.endpoint) { return; }
            tr.querySelector('[data-field="depth"]').textContent = row.depth;
            var dead = tr.querySelector('[data-field="dead_letters"]');
            var link = dead.querySelector("a");
            (link || dead).textContent = row.dead_letters;
            var rate = tr.querySelector('[data-field="rate"]');
            rate.textContent = row.messages_per_second === undefined ? "…" : row.messages_per_second.toFixed(1);
            rate.title = row.rate_kind;
          });
        });
      })
      .catch(function () {});
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (document.getElementById("endpoints")) {
      refresh();
      setInterval(refresh, 2000);
    }
    var all = document.getElementById("select-all");
    if (all) {
      all.addEventListener("change", function () {
        document.querySelectorAll('#dead-letters input[name="id"]').forEach(function (b) { b.checked = all.checked; });
      });
    }
  });
})();
