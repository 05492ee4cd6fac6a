// The console's one script: it refreshes the endpoints table every two
// seconds from /api/stats (writing text only, never HTML), showing the
// broker's errors and a failed refresh, ticks every box of the
// dead-letter list when the header's box is ticked, and asks before a
// delete.
"use strict";
(function () {
  // known shows a count, or "?" when the broker could not be read (null).
  function known(v) { return v === null || v === undefined ? "?" : String(v); }

  function failed(text) {
    var p = document.getElementById("refresh-error");
    if (!p) { return; }
    p.textContent = text;
    p.hidden = text === "";
  }

  function update(tr, row) {
    tr.querySelector('[data-field="depth"]').textContent = known(row.depth);
    var dead = tr.querySelector('[data-field="dead_letters"]');
    var link = dead.querySelector("a");
    if (typeof row.dead_letters === "number" && row.dead_letters > 0) {
      if (!link) {
        link = document.createElement("a");
        link.href = "/endpoints/" + encodeURIComponent(row.endpoint);
        dead.textContent = "";
        dead.appendChild(link);
      }
      link.textContent = String(row.dead_letters);
    } else {
      dead.textContent = known(row.dead_letters);
    }
    var rate = tr.querySelector('[data-field="rate"]');
    rate.textContent = typeof row.messages_per_second === "number" ? row.messages_per_second.toFixed(1) : "…";
    rate.title = row.rate_kind;
    var err = tr.querySelector('[data-field="error"]');
    if (err) { err.textContent = row.error || ""; }
  }

  function refresh() {
    fetch("/api/stats", { credentials: "same-origin" })
      .then(function (r) {
        if (r.ok) { return r.json(); }
        return r.text().then(function (text) {
          throw new Error("HTTP " + r.status + ": " + text.trim());
        });
      })
      .then(function (rows) {
        failed("");
        rows.forEach(function (row) {
          document.querySelectorAll("#endpoints tr[data-endpoint]").forEach(function (tr) {
            if (tr.dataset.endpoint === row.endpoint) { update(tr, row); }
          });
        });
      })
      .catch(function (e) {
        failed("Refreshing failed (" + e.message + "); the figures below are from before.");
      });
  }
  document.addEventListener("DOMContentLoaded", function () {
    if (document.getElementById("endpoints")) {
      refresh();
      setInterval(refresh, 2000);
    }
    // A delete cannot be undone: the browser asks first, naming how
    // many dead letters it would remove.
    document.addEventListener("submit", function (e) {
      var b = e.submitter;
      if (!b || !b.classList.contains("danger")) { return; }
      var n = b.value !== "" || b.id === "delete" ? 1 : document.querySelectorAll('#dead-letters input[name="id"]:checked').length;
      var what = n === 1 ? "this dead letter" : n + " dead letters";
      if (!window.confirm("Delete " + what + "? The message" + (n === 1 ? "" : "s") + " will be gone for good.")) {
        e.preventDefault();
      }
    });
    var all = document.getElementById("select-all");
    if (all) {
      all.addEventListener("change", function () {
        document.querySelectorAll('#dead-letters input[name="id"]').forEach(function (b) { b.checked = all.checked; });
      });
    }
  });
})();
