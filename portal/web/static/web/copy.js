// Copy buttons: every element marked data-copy gets a "Copy" button that puts its text on the
// clipboard (the endpoint URL, the code snippets, a token or key shown once). Runs on load and
// after each htmx swap, so parts of a page that refresh keep their buttons.
(function () {
  "use strict";

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    // Plain HTTP on a non-local host has no clipboard API: select and copy the old way.
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var done = document.execCommand("copy");
    document.body.removeChild(area);
    return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function addButton(target) {
    if (target.dataset.copyReady) return;
    target.dataset.copyReady = "1";
    var button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy " + (target.dataset.copy || "this"));
    button.addEventListener("click", function () {
      copyText(target.innerText.trim()).then(
        function () { button.textContent = "Copied"; },
        function () { button.textContent = "Select and copy"; }
      );
      setTimeout(function () { button.textContent = "Copy"; }, 2000);
    });
    target.insertAdjacentElement("afterend", button);
  }

  function scan(root) {
    root.querySelectorAll("[data-copy]").forEach(addButton);
  }

  document.addEventListener("DOMContentLoaded", function () { scan(document); });
  document.addEventListener("htmx:afterSwap", function (event) { scan(event.target); });
})();
