/* goodlens dashboard: put a live redraw's figure on its graph, keeping the user's view.
 *
 * Dash 4's graph writes the user's zoom back into its `figure` prop (an axis `range` with
 * `autorange: false`), so a new figure without ranges, even with the same `uirevision`,
 * resets the zoom at every redraw. On a timer redraw (`keep`), copy each axis the user set
 * (autorange false) and each trace hidden from the legend (by name) from the figure shown.
 * Running here, the shown figure never travels to the server. */
window.dash_clientside = Object.assign({}, window.dash_clientside, {
  goodlens: {
    keepView: function (next, shown) {
      if (!next || !next.figure) {
        return window.dash_clientside.no_update;
      }
      var fig = next.figure;
      if (!next.keep || !shown) {
        return fig;
      }
      var layout = Object.assign({}, fig.layout || {});
      var old = shown.layout || {};
      Object.keys(old).forEach(function (key) {
        var axis = old[key];
        if (/^[xy]axis\d*$/.test(key) && axis && axis.autorange === false && axis.range) {
          layout[key] = Object.assign({}, layout[key] || {},
                                      {range: axis.range.slice(), autorange: false});
        }
      });
      var hidden = {};
      (shown.data || []).forEach(function (t) {
        if (t && t.visible === "legendonly" && t.name) {
          hidden[t.name] = true;
        }
      });
      var data = (fig.data || []).map(function (t) {
        return hidden[t.name] ? Object.assign({}, t, {visible: "legendonly"}) : t;
      });
      return Object.assign({}, fig, {layout: layout, data: data});
    }
  }
});
