// The deploy form's Scaling section: the Autoscale checkbox shows the policy's fields and
// hides the fixed replicas, and the other way round. Only show and hide: the server decides
// from the checkbox which fields it uses, so the form works the same without this script.
(function () {
  "use strict";
  var box = document.getElementById("autoscale-fields");
  if (!box) return;
  var toggle = document.getElementById(box.dataset.autoscaleFor);
  if (!toggle) return;
  var replicas = document.getElementById(box.dataset.replicas);
  var replicasField = replicas ? replicas.closest(".field") : null;
  var hint = box.querySelector(".hint");

  function update() {
    var on = toggle.checked;
    box.style.display = on ? "" : "none";
    if (replicasField) replicasField.style.display = on ? "none" : "";
    if (hint) hint.style.display = "none";  // what it explains is now visible
    var summary = box.closest("details");
    summary = summary ? summary.querySelector("summary") : null;
    if (summary) summary.textContent = "Scaling: " + (on ? "autoscale" : "a fixed count of replicas");
  }

  toggle.addEventListener("change", update);
  update();
})();
