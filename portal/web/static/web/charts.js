/* The deployment and model pages' metrics charts, drawn with uPlot (static/vendor/uplot).
 *
 * A panel (.metrics-panel[data-metrics-api]) reads the metrics API for the chosen range
 * (?range=15m|1h|6h|24h), draws one chart per entry of the answer's `charts`, and refreshes
 * itself every scrape interval. The x axis spans the data present, not the whole window, so ten
 * minutes of samples fill the chart. When the window holds more than one model version (a
 * rollout), each line is drawn per version so the canary can be read against the old one.
 * Deploys, stage changes and rollbacks (the answer's `markers`) are vertical lines, also listed
 * under the charts. A deployment's canary analysis windows (the panel's data-analysis-windows,
 * as the fragment loaded) are shaded bands labelled with the bake's decision, so a verdict can
 * be read against the lines it was made on; they are listed under the charts too.
 * Hovering shows each series' value in the legend.
 */
(function () {
  "use strict";
  if (window.portalCharts) return;

  var KIND_COLOURS = { deploy: "#2b8a3e", stage: "#7048e8", rollback: "#c92a2a" };
  var DECISION_COLOURS = { promote: "#2b8a3e", hold: "#f08c00", rollback: "#c92a2a" };
  var DECISION_WORDS = { not_enough_data: "not enough data" };
  var LINE_COLOURS = ["#0b5cad", "#d9480f", "#0ca678", "#ae3ec9", "#f08c00", "#495057"];
  var DASHES = [[], [6, 4], [2, 3]];
  var TOTAL_COLOUR = "#495057"; // a line drawn once from the totals beside per-version ones
  var HEIGHT = 170;

  function number(value) {
    if (value == null || isNaN(value)) return "—";
    if (value === 0) return "0";
    var a = Math.abs(value);
    if (a >= 100) return value.toFixed(0);
    if (a >= 1) return String(Number(value.toPrecision(3)));
    return String(Number(value.toPrecision(2)));
  }

  function seconds(iso) {
    return Date.parse(iso) / 1000;
  }

  function timeLabel(t) {
    return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }

  /* A series' legend text. Off the chart (idx null) it is the latest value, so the legend
   * reads "3.6 req/s, latest" at rest rather than a bare dash; a series with no sample in the
   * range, and a hovered pass the series has no sample for, say so in words. */
  function legendValue(u, v, si, idx, unitName) {
    if (idx == null) {
      var values = u.data[si];
      for (var i = values.length - 1; i >= 0; i--) {
        if (values[i] != null) return number(values[i]) + " " + unitName + ", latest";
      }
      return "no data in this range";
    }
    return v == null ? "no sample" : number(v) + " " + unitName;
  }

  /* Whether any of the groups' points has a value for `field`. */
  function carried(groups, field) {
    return groups.some(function (group) {
      return group.points.some(function (p) { return p[field] != null; });
    });
  }

  /* The x values (one per scrape pass) and, per line, its y values aligned to them. A line no
   * version carries on its own (the replicas the deployment wanted) is drawn once, from the
   * totals, even while the others are split by version. */
  function columns(answer, chart) {
    var xs = answer.points.map(function (p) { return seconds(p.at); });
    var index = {};
    xs.forEach(function (x, i) { index[x] = i; });
    var split = answer.versions && answer.versions.length > 1;
    var totals = [{ name: "", points: answer.points }];
    var byVersion = split
      ? answer.versions.map(function (v) { return { name: "v" + v.version, points: v.points }; })
      : totals;
    var series = [];
    chart.lines.forEach(function (line, li) {
      var groups = split && !carried(byVersion, line.field) && carried(totals, line.field)
        ? totals
        : byVersion;
      var once = split && groups === totals;
      groups.forEach(function (group, gi) {
        var ys = xs.map(function () { return null; });
        group.points.forEach(function (p) {
          var i = index[seconds(p.at)];
          var v = p[line.field];
          if (i !== undefined && v != null) ys[i] = v * chart.factor;
        });
        series.push({
          label: group.name ? group.name + " " + line.label : line.label,
          colour: once ? TOTAL_COLOUR : LINE_COLOURS[(split ? gi : li) % LINE_COLOURS.length],
          // Counts often agree (ready = wanted): the second line dashed, so both show.
          dash: split || chart.unit === "instances" ? DASHES[li % DASHES.length] : [],
          values: ys,
        });
      });
    });
    return { xs: xs, series: series };
  }

  /* The analysis windows the page was given, with their times in seconds; none if unreadable. */
  function analysisWindows(root) {
    try {
      return JSON.parse(root.dataset.analysisWindows || "[]").map(function (w) {
        return { start: seconds(w.start), end: seconds(w.end), decision: w.decision, label: w.label };
      });
    } catch (err) {
      return [];
    }
  }

  /* Shade each analysis window on the chart (clipped to the x axis) and write its decision at
   * the band's top left; the figure's data-windows lists the decisions drawn. */
  function drawWindows(u, panel) {
    var ctx = u.ctx;
    var left = u.bbox.left, top = u.bbox.top, width = u.bbox.width, height = u.bbox.height;
    var lo = u.scales.x.min, hi = u.scales.x.max;
    var drawn = [];
    if (lo == null) return drawn;
    ctx.save();
    ctx.font = 11 * devicePixelRatio + "px system-ui, sans-serif";
    ctx.textBaseline = "top";
    ctx.textAlign = "left"; // uPlot leaves the axes' alignment set
    panel.windows.forEach(function (w) {
      if (w.end < lo || w.start > hi) return;
      drawn.push(w.decision);
      var x0 = Math.max(left, u.valToPos(Math.max(w.start, lo), "x", true));
      var x1 = Math.min(left + width, u.valToPos(Math.min(w.end, hi), "x", true));
      var colour = DECISION_COLOURS[w.decision] || "#868e96";
      ctx.globalAlpha = 0.12;
      ctx.fillStyle = colour;
      ctx.fillRect(x0, top, Math.max(1, x1 - x0), height);
      ctx.globalAlpha = 1;
      ctx.fillText(DECISION_WORDS[w.decision] || w.decision, x0 + 3 * devicePixelRatio, top + 2 * devicePixelRatio);
    });
    ctx.restore();
    return drawn;
  }

  function markerPlugin(panel) {
    return {
      hooks: {
        draw: [
          function (u) {
            var ctx = u.ctx;
            var left = u.bbox.left, top = u.bbox.top, height = u.bbox.height;
            var lo = u.scales.x.min, hi = u.scales.x.max;
            var drawn = [];
            ctx.save();
            ctx.lineWidth = 1.5 * devicePixelRatio;
            panel.markers.forEach(function (m) {
              var t = seconds(m.t);
              if (lo == null || t < lo || t > hi) return;
              drawn.push(m.kind);
              var x = Math.round(u.valToPos(t, "x", true));
              ctx.strokeStyle = KIND_COLOURS[m.kind] || "#868e96";
              ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
              ctx.beginPath();
              ctx.moveTo(x, top);
              ctx.lineTo(x, top + height);
              ctx.stroke();
            });
            ctx.restore();
            var windows = drawWindows(u, panel);
            var figure = u.root.closest("figure");
            if (figure) {
              figure.dataset.marks = drawn.join(",");
              figure.dataset.windows = windows.join(",");
            }
          },
        ],
      },
    };
  }

  function Panel(root) {
    this.root = root;
    this.api = root.dataset.metricsApi;
    this.range = (root.querySelector("[aria-pressed=true]") || {}).dataset.range || "1h";
    this.refreshMs = Math.max(5, parseFloat(root.dataset.refreshSeconds) || 15) * 1000;
    this.grid = root.querySelector("[data-chart-grid]");
    this.status = root.querySelector("[data-chart-status]");
    this.plots = {};
    this.shapes = {};
    this.markers = [];
    this.windows = analysisWindows(root);
    var self = this;
    root.querySelectorAll("[data-range]").forEach(function (button) {
      button.addEventListener("click", function () { self.choose(button.dataset.range); });
    });
    this.load();
    this.timer = setInterval(function () {
      if (!document.body.contains(root)) return clearInterval(self.timer);
      if (!document.hidden) self.load();
    }, this.refreshMs);
    window.addEventListener("resize", function () { self.resize(); });
  }

  Panel.prototype.choose = function (range) {
    this.range = range;
    this.root.querySelectorAll("[data-range]").forEach(function (b) {
      var on = b.dataset.range === range;
      b.setAttribute("aria-pressed", on ? "true" : "false");
    });
    this.load();
  };

  Panel.prototype.load = function () {
    var self = this, range = this.range;
    var url = this.api + (this.api.indexOf("?") < 0 ? "?" : "&") + "range=" + encodeURIComponent(range);
    this.root.dataset.loading = "true";
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("the metrics API answered HTTP " + r.status);
        return r.json();
      })
      .then(function (answer) {
        if (range !== self.range) return; // a newer choice is on its way
        self.status.textContent = "";
        self.draw(answer);
      })
      .catch(function (err) { self.status.textContent = "Could not refresh: " + err.message; })
      .finally(function () { self.root.dataset.loading = "false"; });
  };

  Panel.prototype.draw = function (answer) {
    var self = this;
    this.markers = answer.markers || [];
    this.root.dataset.range = this.range;
    this.root.dataset.versions = (answer.versions || []).map(function (v) { return v.version; }).join(",");
    this.showSources(answer.sources || []);
    var empty = this.root.querySelector("[data-testid=metrics-empty]");
    var hasPoints = answer.points.length > 0;
    if (empty) empty.hidden = hasPoints;
    this.grid.hidden = !hasPoints;
    this.showMarkers(hasPoints ? this.markers : [], hasPoints ? this.windows : []);
    if (!hasPoints) return;
    answer.charts.forEach(function (chart) { self.drawChart(answer, chart); });
  };

  Panel.prototype.drawChart = function (answer, chart) {
    var data = columns(answer, chart);
    var figure = this.grid.querySelector("[data-chart=" + chart.key + "]");
    if (!figure) {
      figure = document.createElement("figure");
      figure.className = "chart";
      figure.dataset.chart = chart.key;
      var caption = document.createElement("figcaption");
      caption.innerHTML = "";
      caption.appendChild(document.createTextNode(chart.title + " "));
      var unit = document.createElement("span");
      unit.className = "muted";
      unit.textContent = "(" + chart.unit + ")";
      caption.appendChild(unit);
      figure.appendChild(caption);
      var body = document.createElement("div");
      body.className = "chart-plot";
      figure.appendChild(body);
      this.grid.appendChild(figure);
    }
    var peak = 0, any = false;
    data.series.forEach(function (s) {
      s.values.forEach(function (v) { if (v != null) { any = true; peak = Math.max(peak, v); } });
    });
    figure.dataset.hasData = any ? "true" : "false";
    var note = figure.querySelector("[data-no-data]");
    if (!note) {
      note = document.createElement("p");
      note.className = "muted small";
      note.dataset.noData = "";
      note.textContent = "No samples in this window" +
        (chart.key === "prefix_cache" ? ": no request has reached the prefix cache yet." : ".");
      figure.appendChild(note);
    }
    note.hidden = any;
    figure.dataset.peak = String(peak);
    figure.dataset.series = data.series.map(function (s) { return s.label; }).join("|");
    var shape = figure.dataset.series;
    var plotData = [data.xs].concat(data.series.map(function (s) { return s.values; }));
    var plot = this.plots[chart.key];
    if (plot && this.shapes[chart.key] === shape) {
      plot.setData(plotData);
      return;
    }
    if (plot) plot.destroy();
    var body = figure.querySelector(".chart-plot");
    body.innerHTML = "";
    var unitName = chart.unit;
    // Counts (instances) change in steps: a slope between two passes would read 2.5.
    var paths = window.uPlot.paths;
    var stepped = chart.unit === "instances" && paths && paths.stepped
      ? paths.stepped({ align: 1 })
      : null;
    var options = {
      width: this.width(figure),
      height: HEIGHT,
      plugins: [markerPlugin(this)],
      cursor: { drag: { x: false, y: false } },
      legend: { live: true },
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; } } },
      axes: [
        { stroke: "#495057", grid: { stroke: "#eef0f2" }, ticks: { stroke: "#dee2e6" } },
        {
          stroke: "#495057",
          size: 50,
          grid: { stroke: "#eef0f2" },
          ticks: { stroke: "#dee2e6" },
          values: function (u, splits) { return splits.map(number); },
        },
      ],
      series: [{ label: "time", value: function (u, t) { return t == null ? "hover to read a moment" : new Date(t * 1000).toLocaleString(); } }].concat(
        data.series.map(function (s) {
          var line = {
            label: s.label,
            stroke: s.colour,
            width: 1.5,
            dash: s.dash,
            spanGaps: false,
            points: { show: false },
            value: function (u, v, si, idx) { return legendValue(u, v, si, idx, unitName); },
          };
          if (stepped) line.paths = stepped;
          return line;
        })
      ),
    };
    this.plots[chart.key] = figure.portalPlot = new window.uPlot(options, plotData, body);
    this.shapes[chart.key] = shape;
  };

  Panel.prototype.width = function (figure) {
    return Math.max(240, Math.floor((figure.clientWidth || this.grid.clientWidth || 320) - 20));
  };

  Panel.prototype.resize = function () {
    var self = this;
    Object.keys(this.plots).forEach(function (key) {
      var figure = self.grid.querySelector("[data-chart=" + key + "]");
      if (figure) self.plots[key].setSize({ width: self.width(figure), height: HEIGHT });
    });
  };

  Panel.prototype.showSources = function (sources) {
    var box = this.root.querySelector("[data-testid=sources-down]");
    if (!box) return;
    var down = sources.filter(function (s) { return !s.up; });
    box.hidden = down.length === 0;
    box.textContent = "";
    down.forEach(function (s) {
      var p = document.createElement("p");
      var strong = document.createElement("strong");
      strong.textContent = "Source down: ";
      var code = document.createElement("code");
      code.textContent = s.instance;
      p.appendChild(strong);
      p.appendChild(code);
      p.appendChild(document.createTextNode(" (v" + s.version + "): " + s.error));
      box.appendChild(p);
    });
  };

  Panel.prototype.showMarkers = function (markers, windows) {
    var list = this.root.querySelector("[data-testid=chart-markers]");
    if (!list) return;
    list.textContent = "";
    list.hidden = markers.length === 0 && windows.length === 0;
    markers.forEach(function (m) {
      var li = document.createElement("li");
      li.dataset.kind = m.kind;
      var swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = KIND_COLOURS[m.kind] || "#868e96";
      li.appendChild(swatch);
      li.appendChild(document.createTextNode(timeLabel(seconds(m.t)) + " " + m.kind + ": " + m.label));
      list.appendChild(li);
    });
    windows.forEach(function (w) {
      var li = document.createElement("li");
      li.dataset.kind = "analysis";
      var swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = DECISION_COLOURS[w.decision] || "#868e96";
      swatch.style.opacity = "0.4";
      li.appendChild(swatch);
      li.appendChild(document.createTextNode(
        timeLabel(w.start) + "–" + timeLabel(w.end) + " canary analysis, " + w.label
      ));
      list.appendChild(li);
    });
  };

  function start(scope) {
    if (!window.uPlot) {
      // The fragment's two scripts load in parallel; wait for uPlot.
      return setTimeout(function () { start(scope); }, 50);
    }
    var selector = ".metrics-panel[data-metrics-api]";
    var roots = Array.prototype.slice.call((scope || document).querySelectorAll(selector));
    if (scope && scope.matches && scope.matches(selector)) roots.push(scope);
    roots.forEach(function (root) {
      if (!root.portalPanel) root.portalPanel = new Panel(root);
    });
  }

  window.portalCharts = { start: start, number: number };
  document.addEventListener("htmx:load", function (event) { start(event.detail.elt); });
  start(document);
})();
