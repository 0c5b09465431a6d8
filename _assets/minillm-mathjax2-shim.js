// @jupyter-widgets/html-manager typesets widget labels through the MathJax 2 API
// (MathJax.Hub.Queue(["Typeset", MathJax.Hub, el])); the book loads MathJax 3, which has no Hub
// ("Cannot read properties of undefined (reading 'Queue')"). Map that call onto MathJax 3.
// Deferred, after MathJax's own deferred script; the widgets render on window "load", later still.
(function () {
  const mj = window.MathJax;
  if (!mj || mj.Hub || !mj.startup) return;
  mj.Hub = {
    Queue: function () {
      for (const job of arguments) {
        if (Array.isArray(job) && job[0] === "Typeset") {
          const el = job[2];
          mj.startup.promise = mj.startup.promise.then(() => mj.typesetPromise(el ? [el] : undefined));
        }
      }
    },
  };
})();
