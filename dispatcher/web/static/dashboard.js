// bucket-dispatcher dashboard: refreshes the page's live part every few seconds without a reload.
// The server renders it (escaped); this file only fetches and swaps it. No inline script anywhere:
// the Content-Security-Policy allows this file and nothing else.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var stamp = document.getElementById("updated");
  if (!live) { return; }
  var everyMs = Math.max(1, Number(document.body.getAttribute("data-refresh-s")) || 5) * 1000;
  var inFlight = false;

  function say(text, stale) {
    if (!stamp) { return; }
    stamp.textContent = text;
    stamp.className = stale ? "updated stale" : "updated";
  }

  function busy() {
    // Do not replace a field the user is typing in (a row's box: ticked() decides).
    var active = document.activeElement;
    return document.hidden || Boolean(active && live.contains(active) && active.type !== "checkbox" &&
      /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName));
  }

  function ticked() {
    // Rows ticked for "Retry selected" and the like: a swap would untick them, so wait.
    return Boolean(live.querySelector("input[type=checkbox]:checked"));
  }

  // The header's box ticks or unticks every row of the page.
  live.addEventListener("change", function (event) {
    var box = event.target;
    if (!box || box.id !== "select-all") { return; }
    live.querySelectorAll("input[type=checkbox][name=id]").forEach(function (row) { row.checked = box.checked; });
  });

  function refresh() {
    if (inFlight || busy()) { return; }
    if (ticked()) { say("paused while jobs are ticked", false); return; }
    inFlight = true;
    var controller = new AbortController();
    var timer = setTimeout(function () { controller.abort(); }, everyMs * 2);
    fetch(window.location.href, {
      headers: { "X-Dispatcher-Fragment": "1" }, credentials: "same-origin", cache: "no-store",
      signal: controller.signal
    }).then(function (response) {
      if (response.status === 401) { window.location.assign("/login"); return null; }
      if (!response.ok) { say("refresh failed: HTTP " + response.status, true); return null; }
      return response.text();
    }).then(function (html) {
      if (html === null) { return; }
      live.innerHTML = html;
      say("updated " + new Date().toLocaleTimeString(), false);
      document.body.setAttribute("data-refreshed", String(Date.now()));
    }).catch(function (error) {
      say("refresh failed: " + (error && error.name === "AbortError" ? "timed out" : "unreachable"), true);
    }).finally(function () {
      clearTimeout(timer);
      inFlight = false;
    });
  }

  say("live, every " + everyMs / 1000 + " s", false);
  setInterval(refresh, everyMs);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { refresh(); } });
})();
