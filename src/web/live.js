// postpone dashboard: live updates without a reload. Every few seconds, while the page is
// visible and live updates are on, fetch this same address and swap in the new content of
// each element marked data-live (matched by id). The switch in the header turns it off and
// on; the choice is kept in localStorage. Without this script the pages reload themselves
// through a <noscript> refresh instead.
(function () {
  "use strict";
  var KEY = "postpone-live";
  var body = document.body;
  var every = Number(body.getAttribute("data-live-every")) || 3000;
  var toggle = document.getElementById("live-toggle");
  var state = document.getElementById("live-state");
  if (!toggle || !document.querySelector("[data-live]")) { return; }
  var on = function () { return localStorage.getItem(KEY) !== "off"; };
  toggle.parentNode.hidden = false;
  toggle.checked = on();
  document.documentElement.setAttribute("data-live", on() ? "on" : "off");
  toggle.addEventListener("change", function () {
    localStorage.setItem(KEY, toggle.checked ? "on" : "off");
    document.documentElement.setAttribute("data-live", toggle.checked ? "on" : "off");
    if (toggle.checked) { tick(); }
  });
  var busy = false;
  function tick() {
    if (busy || !on() || document.visibilityState === "hidden") { return; }
    busy = true;
    fetch(location.href, { headers: { "X-Postpone-Live": "1" }, credentials: "same-origin" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) {
        var next = new DOMParser().parseFromString(html, "text/html");
        var regions = document.querySelectorAll("[data-live]");
        for (var i = 0; i < regions.length; i++) {
          var el = regions[i];
          // Never pull the ground from under a person typing or clicking in it.
          if (el.contains(document.activeElement) && document.activeElement !== body) { continue; }
          var fresh = el.id && next.getElementById(el.id);
          if (fresh && fresh.innerHTML !== el.innerHTML) { el.innerHTML = fresh.innerHTML; }
        }
        if (next.title) { document.title = next.title; }
        if (state) { state.textContent = "updated " + new Date().toLocaleTimeString(); }
      })
      .catch(function (e) { if (state) { state.textContent = "update failed: " + e.message; } })
      .then(function () { busy = false; });
  }
  setInterval(tick, every);
})();
