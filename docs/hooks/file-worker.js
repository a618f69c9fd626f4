/* Material's search runs in a Web Worker; a page opened from file:// may not start one (Chromium:
 * "Script at 'file:///...' cannot be accessed from origin 'null'"), so the search box stayed at
 * "Initializing search". On file:// pages only, this replaces Worker with one that runs the worker's
 * script in a hidden same-origin iframe (what Material's offline plugin gets from the iframe-worker
 * shim on a CDN): messages go both ways as "message" events, importScripts loads script tags. The
 * search index itself comes from search/search_index.js (written by offline.py). */
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  class FileWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this._queue = [];
      this._ready = false;
      const frame = document.createElement("iframe");
      frame.setAttribute("aria-hidden", "true");
      frame.tabIndex = -1;
      frame.style.display = "none";
      document.body.appendChild(frame);
      this._frame = frame;
      const win = frame.contentWindow;
      this._win = win;
      const worker = this;
      // the worker's side: postMessage answers the page, importScripts adds script tags
      win.postMessage = function (data) {
        setTimeout(function () { worker._emit(data); }, 0);
      };
      win.importScripts = function () {
        const urls = Array.prototype.slice.call(arguments);
        return urls.reduce(function (done, u) {
          return done.then(function () { return worker._script(new URL(u, worker._src).href); });
        }, Promise.resolve());
      };
      this._src = new URL(url, location.href).href;
      this._script(this._src).then(
        function () {
          worker._ready = true;
          const queued = worker._queue;
          worker._queue = [];
          queued.forEach(function (data) { worker.postMessage(data); });
        },
        function () {
          const ev = new Event("error");
          if (typeof worker.onerror === "function") worker.onerror(ev);
          worker.dispatchEvent(ev);
        }
      );
    }

    _script(src) {
      const doc = this._win.document;
      return new Promise(function (resolve, reject) {
        const s = doc.createElement("script");
        s.src = src;
        s.onload = function () { resolve(); };
        s.onerror = function () { reject(new Error("cannot load " + src)); };
        (doc.body || doc.documentElement).appendChild(s);
      });
    }

    _emit(data) {
      const ev = new MessageEvent("message", { data: data });
      if (typeof this.onmessage === "function") this.onmessage(ev);
      this.dispatchEvent(ev);
    }

    postMessage(data) {
      if (!this._ready) {
        this._queue.push(data);
        return;
      }
      const win = this._win;
      setTimeout(function () {
        win.dispatchEvent(new win.MessageEvent("message", { data: data }));
      }, 0);
    }

    terminate() {
      this._frame.remove();
    }
  }

  window.Worker = FileWorker;
})();
