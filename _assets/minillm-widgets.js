// Loaded between the vendored require.js and @jupyter-widgets/html-manager's embed-amd.js (see _config.yml; this file is in _assets/).
//
// 1. embed-amd.js defines its modules by name ("@jupyter-widgets/controls",
//    "@jupyter-widgets/html-manager/dist/libembed-amd", ...), and each bundle's webpack public path (where
//    it fetches its Font Awesome fonts) is the folder of that module's require.js URL. With no path
//    configured that resolves next to the page (chapters/@jupyter-widgets/...: 404s); point every one of
//    them at the vendored copy, where the fonts are. (The modules are defined inline, never fetched.)
// 2. Widget front-ends that are not built in (anywidget, for the offline explorables) load from the
//    vendored copy too, never from a CDN.
(function () {
  const root = document.documentElement.dataset.content_root || "./";
  const widgets = root + "_static/widgets/";
  const paths = { "@jupyter-widgets/html-manager/dist": root + "_static/widgets", "anywidget": root + "_static/anywidget/index" };
  for (const name of ["base", "base7", "controls", "controls7", "html-manager", "output"]) {
    paths["@jupyter-widgets/" + name] = widgets + name;
  }
  window.require.config({ paths: paths });
})();
