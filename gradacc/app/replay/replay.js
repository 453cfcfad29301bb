// Plays REPLAY (gradacc/app/replay/frames.py): at each frame's second, its changed parts replace the page's and its
// charts are redrawn in place (Plotly.react), each trace cut to the points it had then.
const PARTS = ["panels", "headline", "warnings", "table", "checks"];
const CONFIG = { displaylogo: false, displayModeBar: false, responsive: true };
let timers = [];

function figureAt(name, delta) {
  const final = REPLAY.final[name];
  const layout = JSON.parse(JSON.stringify(delta.layout || final.layout));
  const data = delta.traces.map((trace) => {
    if (!Array.isArray(trace)) return trace;
    const [index, length] = trace;
    const whole = { ...final.data[index] };
    for (const key of ["x", "y", "text", "customdata"]) {
      if (Array.isArray(whole[key])) whole[key] = whole[key].slice(0, length);
    }
    return whole;
  });
  return { data, layout };
}

function draw(frame) {
  for (const part of PARTS) {
    if (part in frame) document.getElementById(part).innerHTML = frame[part];
  }
  const drawn = [];
  for (const [name, delta] of Object.entries(frame.charts || {})) {
    const element = document.getElementById(`chart-${name}`);
    if (!element) continue;
    const figure = figureAt(name, delta);
    figure.layout.template = pageLook(element);
    element.style.height = `${figure.layout.height || 450}px`;
    drawn.push(Plotly.react(element, figure.data, figure.layout, CONFIG));
  }
  return Promise.all(drawn);
}

function tick(frame) {
  document.getElementById("clock").textContent = `${frame.t.toFixed(1)} s of ${REPLAY.end.toFixed(1)} s`;
  return draw(frame);
}

function replay() {
  timers.forEach(clearTimeout);
  const [first, ...rest] = REPLAY.frames;
  // When the page first shows its charts, for whoever measures it (scripts/gallery_first_chart.py).
  tick(first).then(() => { if (!performance.getEntriesByName("gradacc-first-chart").length) performance.mark("gradacc-first-chart"); });
  timers = rest.map((frame) => setTimeout(() => tick(frame), frame.t * 1000));
}

function skip() {
  // The page as it ended: each part and chart as the last frame that changed it left it, drawn once.
  timers.forEach(clearTimeout);
  timers = [];
  const end = { charts: {} };
  for (const frame of REPLAY.frames) {
    for (const part of PARTS) if (part in frame) end[part] = frame[part];
    Object.assign(end.charts, frame.charts || {});
  }
  draw(end);
  document.getElementById("clock").textContent = `${REPLAY.end.toFixed(1)} s of ${REPLAY.end.toFixed(1)} s`;
}

document.getElementById("replay").addEventListener("click", replay);
document.getElementById("skip").addEventListener("click", skip);
// A chart folded away has no size while closed: fit it to its column when opened.
for (const details of document.querySelectorAll("details")) {
  details.addEventListener("toggle", () => details.querySelectorAll(".js-plotly-plot").forEach((chart) => Plotly.Plots.resize(chart)));
}
replay();
