// The page `braid-trace html` fills in: @TITLE@, @SUMMARY@ (tables) and @DATA@ (the
// timeline as JSON, see html.cpp). Plain HTML, CSS and a canvas: no network, no library.
#pragma once

namespace braid::tools::trace_tool {

inline constexpr const char* kHtmlPage = R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>@TITLE@</title>
<style>
  body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
  h1 { font-size: 18px; margin: 0 0 8px; }
  table { border-collapse: collapse; margin: 0 16px 12px 0; display: inline-table; vertical-align: top; }
  th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
  th { background: #f2f2f2; }
  td:first-child, th:first-child { text-align: left; }
  #legend span { display: inline-block; margin-right: 14px; }
  #legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -2px; }
  #view { position: relative; margin-top: 8px; border: 1px solid #ccc; }
  #timeline { display: block; cursor: grab; }
  #tip { position: absolute; pointer-events: none; background: #fffbe6; border: 1px solid #bba;
         padding: 3px 6px; font-size: 12px; white-space: pre; display: none; }
  .hint { color: #777; }
</style>
</head>
<body>
<h1>@TITLE@</h1>
<div id="summary">@SUMMARY@</div>
<div id="legend">
  <span><i style="background:#f28e2b"></i>compute</span>
  <span><i style="background:#e15759"></i>communication, exposed</span>
  <span><i style="background:#59a14f"></i>communication, hidden under compute</span>
  <span><i style="background:#8c8c8c"></i>detail (steps, transport, buckets, pipeline)</span>
  <span class="hint">wheel: zoom &middot; drag: pan &middot; double-click: reset</span>
</div>
<div id="view"><canvas id="timeline"></canvas><div id="tip"></div></div>
<script>
"use strict";
const DATA = @DATA@;
const COLORS = { compute: "#f28e2b", comm: "#e15759", hidden: "#59a14f", detail: "#8c8c8c" };
const LANE = 18, GAP = 8, LABEL = 120, AXIS = 24;
const canvas = document.getElementById("timeline");
const tip = document.getElementById("tip");
const ctx = canvas.getContext("2d");
const lanes = [];
for (const r of DATA.ranks) {
  lanes.push({ rank: r.rank, label: "rank " + r.rank + " compute", kind: "compute", spans: r.compute });
  lanes.push({ rank: r.rank, label: "rank " + r.rank + " comm", kind: "comm", spans: r.comm, hidden: r.hidden });
  lanes.push({ rank: r.rank, label: "rank " + r.rank + " detail", kind: "detail", spans: r.detail });
}
const END = Math.max(DATA.end, 1);
let t0 = 0, t1 = END, width = 800;

function laneTop(i) { return AXIS + i * LANE + Math.floor(i / 3) * GAP; }
function resize() {
  width = Math.max(400, document.getElementById("view").clientWidth - 2);
  const height = laneTop(lanes.length) + 4;
  const scale = window.devicePixelRatio || 1;
  canvas.width = width * scale; canvas.height = height * scale;
  canvas.style.width = width + "px"; canvas.style.height = height + "px";
  ctx.setTransform(scale, 0, 0, scale, 0, 0);
  draw();
}
function x(t) { return LABEL + (t - t0) / (t1 - t0) * (width - LABEL); }
function tAt(px) { return t0 + (px - LABEL) / (width - LABEL) * (t1 - t0); }
function niceStep(span) {
  const raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}
function label(ns) {
  if (ns >= 1e9) return (ns / 1e9).toFixed(3) + " s";
  if (ns >= 1e6) return (ns / 1e6).toFixed(3) + " ms";
  if (ns >= 1e3) return (ns / 1e3).toFixed(1) + " us";
  return Math.round(ns) + " ns";
}
// Fills [begin, end) pairs from a flat array with `stride`, merging anything closer than
// half a pixel, so a lane of a million spans costs at most a few thousand rectangles.
function fillRuns(flat, stride, top, height) {
  let runStart = -1, runEnd = -1;
  for (let i = 0; i < flat.length; i += stride) {
    const b = flat[i], e = flat[i + 1];
    if (e < t0 || b > t1) continue;
    const a = Math.max(LABEL, x(b)), z = Math.min(width, Math.max(x(e), a + 1));
    if (runStart >= 0 && a <= runEnd + 0.5) { runEnd = Math.max(runEnd, z); continue; }
    if (runStart >= 0) ctx.fillRect(runStart, top, runEnd - runStart, height);
    runStart = a; runEnd = z;
  }
  if (runStart >= 0) ctx.fillRect(runStart, top, runEnd - runStart, height);
}
function draw() {
  ctx.clearRect(0, 0, width, canvas.height);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#555"; ctx.strokeStyle = "#e4e4e4";
  const step = niceStep(t1 - t0);
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    const px = x(t);
    ctx.beginPath(); ctx.moveTo(px, AXIS - 4); ctx.lineTo(px, laneTop(lanes.length)); ctx.stroke();
    ctx.fillText(label(t), px + 2, AXIS - 8);
  }
  lanes.forEach((lane, i) => {
    const top = laneTop(i);
    ctx.fillStyle = i % 3 === 0 ? "#222" : "#777";
    ctx.fillText(lane.label, 4, top + LANE - 5);
    ctx.fillStyle = COLORS[lane.kind];
    fillRuns(lane.spans, 5, top + 2, LANE - 4);
    if (lane.hidden) { ctx.fillStyle = COLORS.hidden; fillRuns(lane.hidden, 2, top + 2, LANE - 4); }
  });
}
function spanAt(px, py) {
  for (let i = 0; i < lanes.length; ++i) {
    const top = laneTop(i);
    if (py < top || py >= top + LANE) continue;
    const t = tAt(px), slack = (t1 - t0) / (width - LABEL) * 2, s = lanes[i].spans;
    let best = -1;
    for (let k = 0; k < s.length; k += 5) {
      if (s[k] - slack <= t && t <= s[k + 1] + slack) { best = k; if (s[k] <= t && t <= s[k + 1]) break; }
    }
    return best < 0 ? null : { lane: lanes[i], spans: s, k: best };
  }
  return null;
}
let drag = null;
canvas.addEventListener("mousedown", e => { drag = { x: e.offsetX, t0, t1 }; canvas.style.cursor = "grabbing"; });
window.addEventListener("mouseup", () => { drag = null; canvas.style.cursor = "grab"; });
canvas.addEventListener("mousemove", e => {
  if (drag) {
    const dt = (e.offsetX - drag.x) / (width - LABEL) * (drag.t1 - drag.t0);
    t0 = drag.t0 - dt; t1 = drag.t1 - dt; draw(); return;
  }
  const hit = spanAt(e.offsetX, e.offsetY);
  if (!hit) { tip.style.display = "none"; return; }
  const s = hit.spans, k = hit.k;
  let text = DATA.names[s[k + 2]] + "\n" + label(s[k + 1] - s[k]) + " at " + label(s[k]);
  if (s[k + 3] > 0) text += "\n" + s[k + 3] + " bytes";
  if (s[k + 4] >= 0) text += "\n" + DATA.args[s[k + 4]];
  tip.textContent = text; tip.style.display = "block";
  tip.style.left = Math.min(e.offsetX + 12, width - 260) + "px"; tip.style.top = (e.offsetY + 12) + "px";
});
canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
canvas.addEventListener("wheel", e => {
  e.preventDefault();
  const at = tAt(Math.max(LABEL, e.offsetX)), factor = e.deltaY < 0 ? 0.8 : 1.25;
  t0 = at - (at - t0) * factor; t1 = at + (t1 - at) * factor;
  if (t1 - t0 < 10) { t1 = t0 + 10; }
  draw();
}, { passive: false });
canvas.addEventListener("dblclick", () => { t0 = 0; t1 = END; draw(); });
window.addEventListener("resize", resize);
resize();
</script>
</body>
</html>
)HTML";

}  // namespace braid::tools::trace_tool
