// The deploy form's cost estimate: the chosen instance type's price (its option's data-price)
// times the replicas, per hour and per month, rewritten whenever either changes. Sums are in
// ten-thousandths of a dollar (the price's precision), so nothing is lost to floating point,
// and rounded to the cent halves up, as portal/deployments/costs.py does on the server.
(function () {
  "use strict";
  var out = document.getElementById("cost-estimate");
  if (!out) return;
  var replicas = document.getElementById(out.dataset.forReplicas);
  var type = document.getElementById(out.dataset.forType);
  if (!replicas || !type) return;
  var hoursPerMonth = parseInt(out.dataset.hoursPerMonth, 10);

  function dollars(units) {
    var cents = Math.floor((units + 50) / 100);
    var whole = Math.floor(cents / 100).toLocaleString("en-US");
    var rest = String(cents % 100).padStart(2, "0");
    return "$" + whole + "." + rest;
  }

  function update() {
    var count = Number(replicas.value);
    var option = type.options[type.selectedIndex];
    if (!option || !Number.isInteger(count) || count < 1 || replicas.value.trim() === "") {
      out.textContent = "";
      return;
    }
    var price = option.dataset.price;
    if (price === undefined) {
      out.textContent = out.dataset.noPrice;
      return;
    }
    var perHour = Math.round(parseFloat(price) * 10000) * count;
    out.textContent = "≈ " + dollars(perHour) + "/hour · " + dollars(perHour * hoursPerMonth) +
      "/month for " + count + " instance" + (count === 1 ? "" : "s");
  }

  replicas.addEventListener("input", update);
  type.addEventListener("change", update);
  update();
})();
