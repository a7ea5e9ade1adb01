// Live counts and events over server-sent events. The pages are complete without this script:
// it only keeps the numbers current. Elements with data-live name the event stream; cells with
// data-field inside an element with data-queue take the matching count.
(function () {
  "use strict";
  var MAX_EVENTS = 50;

  function applyCounts(all) {
    Object.keys(all).forEach(function (queue) {
      var scopes = document.querySelectorAll("[data-queue]");
      scopes.forEach(function (scope) {
        if (scope.getAttribute("data-queue") !== queue) return;
        var fields = all[queue];
        scope.querySelectorAll("[data-field]").forEach(function (cell) {
          var name = cell.getAttribute("data-field");
          if (!(name in fields)) return;
          var target = cell.querySelector("a") || cell;
          if (target.textContent !== fields[name]) {
            target.textContent = fields[name];
            if (name === "paused") { cell.className = fields[name]; }
          }
        });
      });
    });
  }

  function addEvent(row) {
    var body = document.querySelector("#events tbody");
    if (!body) return;
    var placeholder = body.querySelector("tr.placeholder");
    if (placeholder) placeholder.remove();
    var tr = document.createElement("tr");
    tr.className = "fresh";
    ["at", "kind", "job_id", "entry_id", "attempt", "detail"].forEach(function (key) {
      var td = document.createElement("td");
      td.textContent = row[key];
      tr.appendChild(td);
    });
    body.insertBefore(tr, body.firstChild);
    while (body.children.length > MAX_EVENTS) body.removeChild(body.lastChild);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var source = document.querySelector("[data-live]");
    if (!source || !window.EventSource) return;
    var stream = new EventSource(source.getAttribute("data-live"));
    stream.addEventListener("counts", function (e) { applyCounts(JSON.parse(e.data)); });
    stream.addEventListener("job-event", function (e) { addEvent(JSON.parse(e.data)); });
    document.documentElement.setAttribute("data-live-connected", "pending");
    stream.addEventListener("open", function () {
      document.documentElement.setAttribute("data-live-connected", "yes");
    });
  });
})();
