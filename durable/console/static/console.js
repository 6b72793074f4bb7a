// durable console: live updates for server-rendered pages (no framework, no build step).
//
// Pollers are elements with data-poll (an HTML fragment replacing the element's content) or
// data-status (JSON run status). Every request has a timeout, failures back off, and a poller
// stops at a final answer. The banner is driven by a registry of failing pollers; one global
// ticker redraws countdowns, "ago" times and the freshness line. Re-renders create no timers
// and no listeners. Markup it reads: <body data-poll-timeout data-fail-threshold>, #banner,
// #freshness, [data-poll] / [data-status] with data-poll-interval, data-poll-timeout,
// data-poll-name, data-poll-paused="1" (never polled); [data-countdown], [data-ago] (epoch
// seconds); #step-N targets. Pollers inside a re-rendered fragment are attached and dropped
// with it. The server answers 2xx (an unknown status too) and may send X-Durable-Final: 1.
// A fragment's <template data-update="ID" data-key="K"> replaces the content of #ID only
// when K differs from #ID's data-key (a run's action forms: swapped when the run's state
// changes what they offer, kept, with what is typed in them, at every other poll). A status
// element with data-found="reload" reloads the page once the status is known (a run's page
// opened before the run existed becomes the run's page).
(function () {
  "use strict";

  const body = document.body;
  const banner = document.getElementById("banner");
  const freshness = document.getElementById("freshness");
  const loadedAt = Date.now();
  const FINAL = new Set(["completed", "failed", "cancelled"]);
  const STATUS_TEXT = {
    queued: "queued", running: "running", completed: "completed",
    failed: "failed", cancelled: "cancelled",
  };
  const MAX_BACKOFF_MS = 30000;

  function num(el, attr, fallback) {
    const v = el && el.getAttribute(attr);
    const n = v === null || v === undefined || v === "" ? NaN : Number(v);
    return Number.isFinite(n) && n >= 0 ? n : fallback;
  }

  const threshold = Math.max(1, num(body, "data-fail-threshold", 2));
  const pageTimeout = num(body, "data-poll-timeout", 5000);

  function hms(ms) {
    const d = new Date(ms);
    return [d.getHours(), d.getMinutes(), d.getSeconds()]
      .map((n) => String(n).padStart(2, "0")).join(":");
  }

  // The failure registry: names of the pollers whose consecutive failures are >= threshold.
  // Only a poller's own success takes its name out, so a healthy poller can never clear the
  // banner that another one raised.
  const failing = new Set();
  const pollers = [];
  const api = {
    pollers: pollers,
    failing: () => Array.from(failing),
    renders: 0,
    refresh: (name) => {
      const p = pollers.find((q) => q.name === name);
      return p ? p.poll() : Promise.reject(new Error("no poller named " + name));
    },
  };
  window.durableConsole = api;

  class Poller {
    constructor(el, kind, name) {
      this.el = el;
      this.kind = kind; // "fragment" | "status"
      this.name = name;
      this.url = el.getAttribute(kind === "status" ? "data-status" : "data-poll");
      this.interval = Math.max(100, num(el, "data-poll-interval", kind === "status" ? 2000 : 1000));
      this.timeout = num(el, "data-poll-timeout", pageTimeout);
      this.failures = 0; // consecutive
      this.successes = 0;
      this.lastSuccess = null; // ms epoch of the last good answer
      this.timer = null; // the one pending setTimeout of this poller, if any
      this.inFlight = null; // the running poll's promise: at most one request at a time
      // data-poll-paused="1": rendered final by the server (or not the live first page)
      this.stopped = el.getAttribute("data-poll-paused") === "1";
    }

    schedule(delay) {
      clearTimeout(this.timer);
      this.timer = this.stopped ? null : setTimeout(() => this.poll(), delay);
    }

    stop() {
      this.stopped = true;
      clearTimeout(this.timer);
      this.timer = null;
      failing.delete(this.name);
    }

    poll() {
      if (this.inFlight) return this.inFlight; // no pile-up: join the request under way
      if (this.stopped) return Promise.resolve();
      clearTimeout(this.timer);
      this.inFlight = this.fetchOnce().then((final) => {
        this.inFlight = null;
        if (final === null) {
          this.failed();
        } else {
          this.succeeded();
          if (final) this.stop();
        }
        if (!this.stopped) this.schedule(this.nextDelay());
        afterChange();
      });
      return this.inFlight;
    }

    // One request, bounded by an AbortController timeout that covers the body too.
    // Resolves to true (final answer), false (answer, keep polling) or null (failure).
    async fetchOnce() {
      const ctrl = new AbortController();
      const timer = setTimeout(() => ctrl.abort(), this.timeout);
      try {
        const resp = await fetch(this.url, {
          headers: { Accept: this.kind === "status" ? "application/json" : "text/html" },
          cache: "no-store",
          credentials: "same-origin",
          signal: ctrl.signal,
        });
        if (!resp.ok) throw new Error("HTTP " + resp.status);
        if (this.kind === "status") {
          const data = await resp.json();
          if (!data || typeof data.status !== "string") throw new Error("no status");
          this.renderStatus(data);
          return FINAL.has(data.status);
        }
        const html = await resp.text();
        this.el.innerHTML = html;
        applyUpdates(this.el);
        api.renders += 1;
        return resp.headers.get("X-Durable-Final") === "1";
      } catch (err) {
        return null;
      } finally {
        clearTimeout(timer);
      }
    }

    renderStatus(data) {
      const known = Object.prototype.hasOwnProperty.call(STATUS_TEXT, data.status);
      if (known && this.el.getAttribute("data-found") === "reload") {
        // found: the server now renders its page; never "queued" above "no such run"
        this.stop();
        this.showStatus("unknown", "found; opening its page", "");
        location.reload();
        return;
      }
      this.showStatus(known ? data.status : "unknown",
        known ? STATUS_TEXT[data.status] : "cannot confirm",
        known ? "" : (data.reason ? String(data.reason) : "the console cannot find this run"));
      api.renders += 1;
    }

    // Unknown is never shown as success: it reads "cannot confirm", with the reason.
    showStatus(state, text, reason) {
      this.el.setAttribute("data-state", state);
      this.el.textContent = text;
      this.el.title = reason;
      if (reason) {
        const small = document.createElement("small");
        small.className = "reason";
        small.textContent = reason;
        this.el.append(" ", small);
      }
    }

    succeeded() {
      this.failures = 0;
      this.successes += 1;
      this.lastSuccess = Date.now();
      failing.delete(this.name);
      this.el.classList.remove("stale");
    }

    failed() {
      this.failures += 1;
      if (this.failures >= threshold) failing.add(this.name); // >=, never ==
      this.el.classList.add("stale");
      if (this.kind === "status") {
        this.showStatus("unknown", "cannot confirm",
          "(no answer since " + hms(this.lastSuccess || loadedAt) + ")");
      }
    }

    // interval after a success; interval * 2^failures after failures, capped, with jitter.
    nextDelay() {
      if (this.failures === 0) return this.interval;
      const base = Math.min(MAX_BACKOFF_MS, this.interval * Math.pow(2, this.failures));
      return Math.min(MAX_BACKOFF_MS, base * (0.8 + 0.4 * Math.random()));
    }
  }

  // Swap in a fragment's templates whose key changed (see the header): one replaceChildren,
  // so a target's content is either kept as it is or rendered anew.
  function applyUpdates(root) {
    root.querySelectorAll("template[data-update]").forEach((tpl) => {
      const target = document.getElementById(tpl.getAttribute("data-update"));
      const key = tpl.getAttribute("data-key");
      if (!target || target.getAttribute("data-key") === key) return;
      target.replaceChildren(tpl.content.cloneNode(true));
      target.setAttribute("data-key", key);
    });
  }

  // Attach a poller to every data-poll / data-status element not yet attached, and drop the
  // pollers whose element a re-render removed (their timers and registry entries go too).
  const attached = new WeakSet();
  function adopt() {
    for (let i = pollers.length - 1; i >= 0; i--) {
      if (!pollers[i].el.isConnected) {
        pollers[i].stop();
        pollers.splice(i, 1);
      }
    }
    document.querySelectorAll("[data-poll], [data-status]").forEach((el) => {
      if (attached.has(el)) return;
      attached.add(el);
      const kind = el.hasAttribute("data-status") ? "status" : "fragment";
      let name = el.getAttribute("data-poll-name") || el.id ||
        el.getAttribute(kind === "status" ? "data-status" : "data-poll");
      const base = name;
      for (let n = 2; pollers.some((p) => p.name === name); n++) name = base + "#" + n;
      const p = new Poller(el, kind, name);
      pollers.push(p);
      if (!p.stopped) p.poll();
    });
  }

  function sinceOldestFailure() {
    const stale = pollers.filter((p) => p.failures > 0);
    return stale.length ? Math.min(...stale.map((p) => p.lastSuccess || loadedAt)) : null;
  }

  function renderBanner() {
    if (!banner) return;
    if (failing.size === 0) {
      banner.hidden = true;
      banner.textContent = "";
      return;
    }
    const n = failing.size;
    const since = hms(sinceOldestFailure() || loadedAt);
    banner.textContent = "Lost contact with the console: " + n + " live view" +
      (n === 1 ? " is" : "s are") + " not updating (since " + since + "). Retrying.";
    banner.hidden = false;
  }

  function renderFreshness() {
    if (!freshness) return;
    const stale = sinceOldestFailure();
    if (stale !== null) {
      freshness.textContent = "stale since " + hms(stale);
      freshness.className = "stale";
      return;
    }
    const last = Math.max(loadedAt, ...pollers.map((p) => p.lastSuccess || 0));
    const live = pollers.some((p) => !p.stopped);
    freshness.textContent = (live ? "live · updated " : "updated ") + hms(last);
    freshness.className = live ? "live" : "";
  }

  function plural(n, unit) { return n + " " + unit; }
  function two(n) { return String(n).padStart(2, "0"); }

  function countdownText(seconds) {
    const s = Math.ceil(seconds);
    if (s <= 0) return "due now";
    if (s < 60) return "in " + s + " s";
    if (s < 3600) return "in " + Math.floor(s / 60) + " min " + two(s % 60) + " s";
    if (s < 86400) return "in " + Math.floor(s / 3600) + " h " + two(Math.floor(s / 60) % 60) + " min";
    return "in " + Math.floor(s / 86400) + " d " + two(Math.floor(s / 3600) % 24) + " h";
  }

  function agoText(seconds) {
    const s = Math.floor(seconds);
    if (s < 1) return "just now";
    if (s < 60) return plural(s, "s") + " ago";
    if (s < 3600) return plural(Math.floor(s / 60), "min") + " ago";
    if (s < 86400) return plural(Math.floor(s / 3600), "h") + " ago";
    return plural(Math.floor(s / 86400), "d") + " ago";
  }

  // Countdowns and "ago" times under root, found by querying the DOM each time: elements
  // from a re-render are picked up without any timer of their own.
  function redrawTimes(root) {
    const now = Date.now() / 1000;
    root.querySelectorAll("[data-countdown]").forEach((el) => {
      const at = Number(el.getAttribute("data-countdown"));
      if (Number.isFinite(at)) el.textContent = countdownText(at - now);
    });
    root.querySelectorAll("[data-ago]").forEach((el) => {
      const at = Number(el.getAttribute("data-ago"));
      if (Number.isFinite(at)) el.textContent = agoText(now - at);
    });
  }

  // The element targeted by the hash gets "highlight" (others lose it); scrolled into view on
  // load and on hashchange (or at the first render that brings it), not on later re-renders:
  // the operator may have scrolled away.
  let scrolled = false;
  function highlight() {
    let target = null;
    try {
      const id = decodeURIComponent(location.hash.slice(1));
      target = id ? document.getElementById(id) : null;
    } catch (err) { /* a malformed hash targets nothing */ }
    document.querySelectorAll(".highlight").forEach((el) => {
      if (el !== target) el.classList.remove("highlight");
    });
    if (target) {
      target.classList.add("highlight");
      if (!scrolled) target.scrollIntoView({ block: "center" });
      scrolled = true;
    }
  }

  function afterChange() {
    adopt();
    highlight();
    redrawTimes(document);
    renderBanner();
    renderFreshness();
  }

  function tick() {
    redrawTimes(document);
    renderFreshness();
  }

  // Created once, at load: the page's only interval and its only listener.
  setInterval(tick, 1000);
  window.addEventListener("hashchange", () => { scrolled = false; highlight(); });

  adopt();
  highlight();
  tick();
})();
