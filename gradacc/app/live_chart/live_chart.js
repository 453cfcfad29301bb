// One plotly chart that stays in the page: the first draw creates it, every later one changes it in place
// (Plotly.react), instead of Streamlit creating the whole chart anew each time its figure changes.
const LOADED = "__gradaccPlotly";

function loadPlotly(url) {
  // Once per page, shared by every chart on it.
  if (!window[LOADED]) {
    window[LOADED] = scriptUrl(url).then((src) => new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = src;
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => reject(new Error(`plotly did not load from ${url}`));
      document.head.appendChild(script);
    })).catch((error) => { window[LOADED] = null; throw error; });
  }
  return window[LOADED];
}

// plotly.js comes gzipped as it is stored (the server would gzip the plain file again for every visitor, in
// Python: see live_chart/__init__.py); unzip it here and run it from a blob. Without DecompressionStream
// (Safari before 16.4), load the plain copy beside it.
async function scriptUrl(url) {
  if (typeof DecompressionStream === "undefined") return url.replace(/\.gz$/, "");
  const response = await fetch(url);
  if (!response.ok) throw new Error(`plotly did not load from ${url} (HTTP ${response.status})`);
  const code = await new Response(response.body.pipeThrough(new DecompressionStream("gzip"))).blob();
  return URL.createObjectURL(new Blob([code], { type: "text/javascript" }));
}

export default function (component) {
  const { data, parentElement } = component;
  let chart = parentElement.querySelector(".gradacc-live-chart");
  if (!chart) {
    chart = document.createElement("div");
    chart.className = "gradacc-live-chart";
    parentElement.appendChild(chart);
    // Fit the chart to its column whenever that changes: a window resize, the sidebar, or an expander opening
    // (a chart drawn while hidden has no width to take).
    // Only a displayed chart can be resized: one in a closed expander or a page being left has no size (plotly
    // would log "Resize must be passed a displayed plot div element").
    new ResizeObserver(() => {
      if (window.Plotly && chart.data && chart.isConnected && chart.offsetParent !== null) {
        window.Plotly.Plots.resize(chart).catch(() => {});
      }
    }).observe(chart);
  }
  if (!data || chart.dataset.revision === `${data.revision} ${data.toolbar}`) return;  // nothing new to draw
  chart.dataset.revision = `${data.revision} ${data.toolbar}`;
  const figure = JSON.parse(data.figure);
  figure.layout.template = pageLook(parentElement);
  figure.layout.uirevision ??= "kept";  // a zoom or a hidden line stays while points arrive; untouched axes still fit
  chart.style.height = `${figure.layout.height || 450}px`;
  loadPlotly(data.plotly_url).then((Plotly) => {
    if (chart.dataset.revision !== `${data.revision} ${data.toolbar}`) return;  // a newer figure came meanwhile
    Plotly.react(chart, figure.data, figure.layout,
                 { displaylogo: false, displayModeBar: data.toolbar === false ? false : "hover" });
  }).catch((error) => { chart.textContent = `This chart cannot be drawn: ${error.message}.`; });
}
