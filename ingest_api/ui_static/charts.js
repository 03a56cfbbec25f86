// Small SVG line charts for the dashboard: no library, no network.
(function () {
"use strict";

const COLORS = ["#3b6fd8", "#d8663b", "#2f9e57", "#9b4fd1", "#c9a227", "#1aa3a3", "#c23b6e", "#5b6b82"];
const SVG_NS = "http://www.w3.org/2000/svg";

function svgElement(name, attributes, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attributes)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function shortNumber(value) {
  if (value >= 1e9) return (value / 1e9).toFixed(1) + "G";
  if (value >= 1e6) return (value / 1e6).toFixed(1) + "M";
  if (value >= 1e3) return (value / 1e3).toFixed(1) + "k";
  if (value >= 10 || value === 0) return String(Math.round(value));
  return String(Number(value.toPrecision(2)));
}

// series: {name: [[time_ms, value], ...]}; draws the last `spanMs` milliseconds.
function drawLineChart(svg, series, spanMs) {
  const width = svg.clientWidth || 400;
  const height = svg.clientHeight || 150;
  const pad = {left: 40, right: 8, top: 8, bottom: 18};
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const now = Date.now();
  const start = now - spanMs;
  let max = 0;
  for (const points of Object.values(series)) {
    for (const [t, v] of points) if (t >= start && v > max) max = v;
  }
  max = max > 0 ? max * 1.1 : 1;
  const x = (t) => pad.left + ((t - start) / spanMs) * (width - pad.left - pad.right);
  const y = (v) => height - pad.bottom - (v / max) * (height - pad.top - pad.bottom);
  for (const fraction of [0, 0.5, 1]) {
    const value = max * fraction;
    svg.appendChild(svgElement("line", {class: "grid", x1: pad.left, x2: width - pad.right, y1: y(value), y2: y(value)}));
    svg.appendChild(svgElement("text", {x: pad.left - 4, y: y(value) + 3, "text-anchor": "end"}, shortNumber(value)));
  }
  svg.appendChild(svgElement("text", {x: pad.left, y: height - 4}, `-${Math.round(spanMs / 1000)} s`));
  svg.appendChild(svgElement("text", {x: width - pad.right, y: height - 4, "text-anchor": "end"}, "now"));
  Object.keys(series).sort().forEach((name, i) => {
    const color = COLORS[i % COLORS.length];
    const points = series[name].filter(([t]) => t >= start);
    if (points.length) {
      const line = points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
      svg.appendChild(svgElement("polyline", {points: line, stroke: color, "data-series": name}));
    }
    svg.appendChild(svgElement("text", {class: "legend", x: pad.left + 6, y: pad.top + 10 + i * 12, fill: color}, name));
  });
}

window.logbrokerCharts = {drawLineChart, shortNumber};
})();
