// The deployment page's Logs panel: the picked instance's last lines, then its new lines as
// they come, by calling GET /api/v1/instances/<id>/logs/ with the previous answer's `next` and
// follow=1 (the server holds each call at most ~20 s). A failed instance shows its summary,
// rendered by the page, instead: its log has ended and is not repeated.
(function () {
  "use strict";
  var picker = document.getElementById("log-instance");
  if (!picker) return;
  var panel = picker.closest(".instance-logs");
  var out = panel.querySelector("[data-testid=log-lines]");
  var status = panel.querySelector("[data-testid=log-status]");
  var KEEP = 5000; // lines kept on the page; older ones are dropped
  var run = 0; // bumped on each pick, so the previous loop stops

  function show(lines) {
    if (!lines.length) return;
    var stick = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
    out.appendChild(document.createTextNode(lines.join("\n") + "\n"));
    var text = out.textContent;
    var extra = text.split("\n").length - 1 - KEEP;
    if (extra > 0) {
      var cut = 0;
      for (var i = 0; i < extra; i++) cut = text.indexOf("\n", cut) + 1;
      out.textContent = text.slice(cut);
    }
    if (stick) out.scrollTop = out.scrollHeight;
  }

  function pick() {
    var option = picker.options[picker.selectedIndex];
    var mine = ++run;
    var failed = option.dataset.state === "failed";
    panel.querySelectorAll(".log-failure").forEach(function (box) {
      box.hidden = box.dataset.instance !== option.value;
    });
    out.textContent = "";
    out.hidden = failed && panel.querySelector('.log-failure[data-instance="' + option.value + '"]') !== null;
    if (out.hidden) { status.textContent = ""; return; }
    status.textContent = "loading…";
    follow(option.dataset.url, null, mine, 0);
  }

  function follow(url, since, mine, failures) {
    if (mine !== run) return;
    var query = since === null ? "?tail=200" : "?follow=1&since=" + encodeURIComponent(since);
    fetch(url + query, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (answer) {
        if (!answer.ok) throw new Error("HTTP " + answer.status);
        return answer.json();
      })
      .then(function (body) {
        if (mine !== run) return;
        show(body.lines);
        if (body.ended) { status.textContent = "the instance has ended"; return; }
        status.textContent = "following";
        follow(url, body.next, mine, 0);
      })
      .catch(function (error) {
        if (mine !== run) return;
        status.textContent = "could not read the log (" + error.message + "); trying again";
        setTimeout(function () { follow(url, since, mine, failures + 1); },
          Math.min(30000, 2000 * (failures + 1)));
      });
  }

  picker.addEventListener("change", pick);
  pick();
})();
