// How every chart of gradacc looks, in the app (live_chart.js) and in a replay page (gradacc/app/replay).
// The page's own type and colours, on a transparent background, so the chart reads in a light or a dark theme.
function pageLook(element) {
  const style = getComputedStyle(element);
  const grid = "rgba(128, 128, 128, 0.25)";
  const axis = { gridcolor: grid, zerolinecolor: grid, linecolor: grid };
  return {
    layout: {
      font: { family: style.fontFamily, color: style.color },
      title: { x: 0, xanchor: "left", font: { weight: 600 } },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      xaxis: axis, yaxis: axis, xaxis2: axis, yaxis2: axis,
      hoverlabel: { font: { family: style.fontFamily } },
    },
  };
}
