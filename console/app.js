// jobcenter web console: the session, the hash router and every page but the job graph (graph.js).
"use strict";

(() => {
  // ---------------------------------------------------------------- basics

  const pageEl = document.getElementById("page");

  const STATE_SYMBOLS = {
    succeeded: "✓",
    failed: "✗",
    upstream_failed: "⊘",
    running: "▶",
    assigned: "▷",
    pending: "◷",
    ready: "◷",
    canceled: "■",
  };

  const JOB_STATES = ["pending", "running", "succeeded", "failed", "canceled"];

  /** The symbol and the word of a state, e.g. "✗ failed". */
  function stateLabel(state) {
    return `${STATE_SYMBOLS[state] || "•"} ${state}`;
  }

  /**
   * An element: `attrs` sets attributes (`class`, `data-*`, `aria-*`, ...),
   * properties for keys starting with "." and listeners for keys starting
   * with "on"; children are nodes or text (always inserted as text).
   */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key.startsWith("on") && typeof value === "function") {
        el.addEventListener(key.slice(2), value);
      } else if (key.startsWith(".")) {
        el[key.slice(1)] = value;
      } else {
        el.setAttribute(key, value === true ? "" : String(value));
      }
    }
    append(el, children);
    return el;
  }

  function append(el, ...children) {
    for (const child of children.flat(Infinity)) {
      if (child === undefined || child === null || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  /** A state word marked with its state; the stylesheet adds the symbol. */
  function stateBadge(state, tag = "span", extra = {}) {
    const cls = extra.class ? `state ${extra.class}` : "state";
    return h(tag, { ...extra, class: cls, "data-state": state }, state);
  }

  function link(path, text, attrs = {}) {
    return h("a", { ...attrs, href: `#${path}` }, text);
  }

  function jobLink(id, text) {
    return link(`/jobs/${encodeURIComponent(id)}`, text || shortId(id), { class: "mono", title: id });
  }

  function typeLink(jobType) {
    return link(`/types/${encodeURIComponent(jobType)}`, jobType);
  }

  /** The end of an id (a UUID's random part), enough to tell ids apart at a glance. */
  function shortId(id) {
    return id && id.length > 13 ? `…${id.slice(-8)}` : id || "";
  }

  // ------------------------------------------------------------- formatting

  function pad(n) {
    return String(n).padStart(2, "0");
  }

  /** A moment as local "YYYY-MM-DD HH:MM:SS"; "—" for none. */
  function formatTime(ms) {
    if (!ms) return "—";
    const d = new Date(ms);
    const date = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
    return `${date} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function formatClock(ms) {
    const d = new Date(ms);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  /** A length of time, e.g. "850 ms", "12 s", "3 min 4 s", "2 h 5 min". */
  function formatDuration(ms) {
    if (ms === undefined || ms === null || ms < 0) return "—";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const s = Math.round(ms / 1000);
    if (s < 60) return `${s} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return s % 60 ? `${m} min ${s % 60} s` : `${m} min`;
    const hours = Math.floor(m / 60);
    if (hours < 48) return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
    return `${Math.floor(hours / 24)} d ${hours % 24} h`;
  }

  function formatAge(ms) {
    if (!ms) return "never";
    return `${formatDuration(Math.max(0, Date.now() - ms))} ago`;
  }

  /** A moment as an element: its age, with the exact time as a tooltip. */
  function timeEl(ms, asAge = false) {
    if (!ms) return h("span", { class: "muted" }, "—");
    const text = asAge ? formatAge(ms) : formatTime(ms);
    return h("time", { datetime: new Date(ms).toISOString(), title: formatTime(ms) }, text);
  }

  // ---------------------------------------------------------------- the API

  const session = { csrf: "", tokenRequired: false, name: "", role: "" };

  /**
   * Calls the admin API: JSON in and out (a string body is sent as is);
   * writes carry the session's anti-forgery token. An error answer becomes
   * a thrown Error with `.status` and `.body`; a 401 shows the sign-in.
   */
  async function api(method, path, body, retried = false) {
    const response = await fetch(path, requestInit(method, body));
    const data = await readBody(response);
    if (response.ok) return data;
    const error = new Error((data && data.error) || `${response.status} ${response.statusText}`);
    error.status = response.status;
    error.body = data;
    if (response.status === 401 && !path.startsWith("/api/session")) {
      showLogin();
    } else if (response.status === 403 && !retried && (await refreshCsrf())) {
      return api(method, path, body, true);
    }
    throw error;
  }

  function requestInit(method, body) {
    const headers = {};
    const init = { method, credentials: "same-origin", headers };
    if (!["GET", "HEAD"].includes(method)) headers["X-CSRF-Token"] = session.csrf;
    if (typeof body === "string") {
      headers["Content-Type"] = "text/plain; charset=utf-8";
      init.body = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return init;
  }

  async function readBody(response) {
    const text = await response.text();
    if (!text) return null;
    try {
      return JSON.parse(text);
    } catch (_) {
      return { error: text.trim() };
    }
  }

  /** Reads the session again; true when its anti-forgery token changed. */
  async function refreshCsrf() {
    try {
      const before = session.csrf;
      const state = await api("GET", "/api/session");
      session.csrf = state.csrf || "";
      return session.csrf !== before;
    } catch (_) {
      return false;
    }
  }

  // ------------------------------------------------------- the confirmation

  const dialog = document.getElementById("confirm");

  /** Asks `text` in the dialog; resolves true when the operator confirms. */
  function confirmAction(text, yesLabel = "Confirm") {
    if (dialog.open) return Promise.resolve(false);
    document.getElementById("confirm-text").textContent = text;
    document.getElementById("confirm-yes").textContent = yesLabel;
    dialog.returnValue = "";
    const opener = document.activeElement;
    const answer = new Promise((resolve) => {
      dialog.addEventListener("close", () => {
        if (opener && opener.isConnected) opener.focus();
        resolve(dialog.returnValue === "yes");
      }, { once: true });
    });
    dialog.showModal();
    document.getElementById("confirm-no").focus();
    return answer;
  }

  // ------------------------------------------------------------ page scope

  /**
   * What one shown page owns: its timers and its pending answers. When the
   * page is left, timers stop and late answers are dropped.
   */
  class Scope {
    constructor() {
      this.alive = true;
      this.timers = new Set();
      this.cleanups = [];
    }

    /** Like api(), but never settles once the page has been left. */
    api(method, path, body) {
      return new Promise((resolve, reject) => {
        api(method, path, body).then(
          (value) => this.alive && resolve(value),
          (error) => this.alive && reject(error),
        );
      });
    }

    /** Runs `fn` after `ms` unless the page has been left; answers the timer. */
    later(ms, fn) {
      const timer = setTimeout(() => {
        this.timers.delete(timer);
        if (this.alive) fn();
      }, ms);
      this.timers.add(timer);
      return timer;
    }

    onLeave(fn) {
      this.cleanups.push(fn);
    }

    dispose() {
      this.alive = false;
      this.timers.forEach(clearTimeout);
      this.timers.clear();
      this.cleanups.forEach((fn) => fn());
    }
  }

  function markLoaded(scope) {
    if (scope.alive) pageEl.dataset.loaded = "1";
  }

  /**
   * Runs `load` now and again `ms` after each run ends (skipping runs while
   * the browser tab is hidden). The first success marks the page loaded; a
   * failure shows in the page's notice and is tried again.
   */
  function keepLoading(scope, ms, load, notice) {
    const run = async () => {
      if (!document.hidden || !pageEl.dataset.loaded) {
        try {
          await load();
          markLoaded(scope);
          showNotice(notice, "");
        } catch (error) {
          if (!scope.alive || error.status === 401) return;
          showNotice(notice, `Could not refresh: ${error.message}. Trying again.`);
        }
      }
      scope.later(ms, run);
    };
    run();
  }

  function showNotice(el, text) {
    if (!el) return;
    el.textContent = text;
    el.hidden = !text;
  }

  /** The common top of a page: its title, an optional line and a notice area. */
  function pageHead(title, ...extra) {
    const heading = h("h1", { tabindex: "-1" }, title);
    const notice = h("p", { class: "notice", role: "status", hidden: true });
    const updated = h("p", { class: "updated muted", "aria-live": "off" });
    const head = h("header", { class: "page-head" }, heading, extra, updated);
    return { head, heading, notice, updated };
  }

  function touch(updated) {
    updated.textContent = `Updated ${formatClock(Date.now())}`;
  }

  function errorBox(error, id) {
    return h("div", { class: "error-box", role: "alert", id }, error.message || String(error));
  }

  /** A table in a box that scrolls sideways when the screen is narrow. */
  function tableEl(attrs, headers, rows) {
    return h("div", { class: "table-wrap" }, h("table", attrs, headRow(headers), h("tbody", {}, rows)));
  }

  /** A column of numbers, right-aligned like its values. */
  function num(text) {
    return { text, num: true };
  }

  function headRow(headers) {
    return h("thead", {}, h("tr", {}, headers.map((col) =>
      h("th", { scope: "col", class: col.num ? "num" : null }, col.text ?? col))));
  }

  function emptyRow(columns, text) {
    return h("tr", { class: "empty" }, h("td", { colspan: columns }, text));
  }

  /** Replaces a container's children, keeping focus on an element with the same `data-key` when there was one. */
  function replaceKeepingFocus(container, children) {
    const focused = document.activeElement;
    const key = focused && container.contains(focused) ? focusKey(focused) : null;
    container.replaceChildren(...children);
    if (!key) return;
    const again = container.querySelector(key);
    if (again) again.focus();
  }

  const KEY_ATTRS = ["data-job", "data-worker", "data-type", "data-instance", "data-key"];

  /** A selector that finds `el` again in freshly built rows: its row's key, its tag and its link. */
  function focusKey(el) {
    const row = el.closest(KEY_ATTRS.map((a) => `[${a}]`).join(","));
    if (!row) return null;
    const attr = KEY_ATTRS.find((a) => row.hasAttribute(a));
    const href = el.getAttribute("href");
    const tag = el.tagName.toLowerCase();
    return `[${attr}="${CSS.escape(row.getAttribute(attr))}"] ${tag}${href ? `[href="${CSS.escape(href)}"]` : ""}`;
  }

  const shownData = new WeakMap();

  /** Rebuilds a container only when the data it shows changed. */
  function renderIfChanged(container, data, build) {
    const signature = JSON.stringify(data);
    if (shownData.get(container) === signature) return;
    shownData.set(container, signature);
    replaceKeepingFocus(container, [build(data)].flat());
  }

  // ---------------------------------------------------------------- router

  const ROUTES = [
    { re: /^\/$/, page: "overview", title: "Overview", render: renderOverview },
    { re: /^\/jobs$/, page: "jobs", title: "Jobs", render: renderJobs },
    { re: /^\/jobs\/([^/]+)$/, page: "job", title: "Job", render: renderJob },
    { re: /^\/submit$/, page: "submit", title: "Submit", render: renderSubmit },
    { re: /^\/workers$/, page: "workers", title: "Workers", render: renderWorkers },
    { re: /^\/types$/, page: "types", title: "Job types", render: renderTypes },
    { re: /^\/types\/([^/]+)$/, page: "type", title: "Job type", render: renderType },
    { re: /^\/recovery$/, page: "recovery", title: "Recovery", render: renderRecovery },
    { re: /^\/audit$/, page: "audit", title: "Audit", render: renderAudit },
    { re: /^\/capacity$/, page: "capacity", title: "Capacity", render: renderCapacity },
    { re: /^\/schedules$/, page: "schedules", title: "Schedules", render: renderSchedules },
  ];

  let current = null;
  let signedOut = false;

  function parseHash() {
    const raw = location.hash.replace(/^#/, "") || "/";
    const [path, search] = raw.split("?");
    return { path: path || "/", query: new URLSearchParams(search || "") };
  }

  function navigate(path) {
    location.hash = path.startsWith("#") ? path : `#${path}`;
  }

  function leavePage() {
    if (dialog.open) dialog.close("no");
    if (!current) return;
    current.scope.dispose();
    current = null;
  }

  /** Shows the page the fragment names. */
  function route(focus) {
    if (signedOut) return;
    leavePage();
    const { path, query } = parseHash();
    const found = ROUTES.map((r) => [r, path.match(r.re)]).find(([, m]) => m);
    const [spec, match] = found || [null, null];
    const scope = new Scope();
    current = { scope, spec };
    preparePage(spec ? spec.page : "notfound", spec ? spec.title : "Not found");
    markNav(path);
    if (!spec) {
      renderNotFound(scope, path);
    } else {
      const params = match.slice(1).map(decodePart);
      spec.render(scope, params, query);
    }
    if (focus) {
      window.scrollTo(0, 0);
      const heading = pageEl.querySelector("h1");
      (heading || pageEl).focus({ preventScroll: true });
    }
  }

  function decodePart(part) {
    try {
      return decodeURIComponent(part);
    } catch (_) {
      return part;
    }
  }

  function preparePage(name, title) {
    pageEl.dataset.page = name;
    delete pageEl.dataset.loaded;
    pageEl.replaceChildren();
    document.title = `${title} · jobcenter`;
  }

  function markNav(path) {
    const section = path === "/" ? "/" : `/${path.split("/")[1]}`;
    for (const a of document.querySelectorAll("#nav a")) {
      const target = a.getAttribute("href").slice(1);
      if (target === section) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
  }

  function renderNotFound(scope, path) {
    const { head } = pageHead("Not found");
    append(pageEl, head, h("p", {}, `Nothing lives at ${path}. `, link("/", "Go to the overview"), "."));
    markLoaded(scope);
  }

  // ----------------------------------------------------------------- login

  /** Shows only the sign-in form (the token is asked when the server needs one). */
  function showLogin(message) {
    leavePage();
    signedOut = true;
    document.body.dataset.auth = "out";
    document.getElementById("nav-links").hidden = true;
    document.getElementById("session-box").hidden = true;
    preparePage("login", "Sign in");
    const error = h("p", { id: "login-error", class: "error-text", role: "alert" }, message || "");
    const input = h("input", { id: "token", type: "password", name: "token", autocomplete: "current-password", required: true });
    const button = h("button", { id: "login-submit", type: "submit", class: "primary" }, "Sign in");
    const form = h("form", { id: "login", class: "login" },
      h("h1", {}, "Sign in"),
      h("p", { class: "muted" }, "This admin server needs a credential: its admin token, or a named token of its credentials file."),
      h("label", { for: "token" }, "Token"), input, button, error);
    form.addEventListener("submit", (event) => signIn(event, input, button, error));
    append(pageEl, form);
    pageEl.dataset.loaded = "1";
    input.focus();
  }

  async function signIn(event, input, button, error) {
    event.preventDefault();
    error.textContent = "";
    button.disabled = true;
    try {
      const answer = await api("POST", "/api/session", { token: input.value });
      session.csrf = answer.csrf || "";
      session.name = answer.name || "";
      session.role = answer.role || "";
      signedIn();
      route(true);
    } catch (e) {
      error.textContent = e.status === 401 ? `Refused: ${e.message}` : e.message;
      input.select();
      input.focus();
    } finally {
      button.disabled = false;
    }
  }

  /** A viewer is shown no control that changes anything (the server refuses it anyway). */
  function canWrite(role) {
    return role === "operator" || role === "admin";
  }

  function signedIn() {
    signedOut = false;
    document.body.dataset.auth = "in";
    document.body.dataset.canWrite = String(canWrite(session.role));
    document.body.dataset.isAdmin = String(session.role === "admin" || session.role === "");
    document.getElementById("who").textContent = session.name ? `${session.name} (${session.role})` : "";
    document.getElementById("nav-links").hidden = false;
    document.getElementById("session-box").hidden = !session.tokenRequired;
  }

  async function signOut() {
    try {
      await api("DELETE", "/api/session");
    } catch (_) {
      // Signed out either way: the form comes next.
    }
    session.csrf = "";
    showLogin("Signed out.");
  }

  // -------------------------------------------------------------- overview

  function renderOverview(scope) {
    const { head, notice, updated } = pageHead("Overview");
    const counts = h("section", { class: "cards", "aria-label": "Jobs by state" },
      JOB_STATES.map((state) => countCard(state)));
    const figures = h("dl", { class: "figures" });
    const instances = h("div");
    const recovery = h("div");
    const activities = h("ol", { id: "overview-activities", class: "log" });
    append(pageEl, head, notice, counts, figures,
      h("section", {}, h("h2", {}, "Servers"), instances),
      h("section", {}, h("h2", {}, "Last recovery check"), recovery),
      h("section", {}, h("h2", {}, "Scheduler activity"), activities));
    keepLoading(scope, 2000, async () => {
      const data = await scope.api("GET", "/api/overview");
      fillCounts(counts, data.jobs_by_state || {});
      figures.replaceChildren(...overviewFigures(data));
      replaceKeepingFocus(instances, [instancesTable(scope, data.instances || [])]);
      renderIfChanged(recovery, data.recovery || null, lastRecovery);
      renderIfChanged(activities, data.activities || [], (list) => activityItems(list, "No scheduler activity yet."));
      touch(updated);
    }, notice);
  }

  function countCard(state) {
    return h("a", { class: "card", href: `#/jobs?state=${state}`, "data-state": state },
      h("span", { class: "count", "data-count": state }, "–"),
      stateBadge(state, "span", { class: "card-label" }));
  }

  function fillCounts(counts, byState) {
    for (const state of JOB_STATES) {
      counts.querySelector(`[data-count="${state}"]`).textContent = String(byState[state] || 0);
    }
  }

  function overviewFigures(data) {
    const figure = (label, id, value) => h("div", {}, h("dt", {}, label), h("dd", { id }, String(value)));
    return [
      figure("Tasks running", "overview-tasks-running", data.tasks_running || 0),
      figure("Workers", "overview-workers", data.workers || 0),
      figure("Execution slots free", "overview-slots",
        `${data.execution_slots_free || 0} of ${data.execution_slots_total || 0}`),
    ];
  }

  function instancesTable(scope, instances) {
    const rows = instances.map((i) => h("tr", { "data-instance": i.id },
      h("td", { class: "mono" }, i.id),
      h("td", {}, i.role),
      h("td", {}, i.status, i.answering === false ? " (not answering)" : ""),
      h("td", { class: "mono" }, i.grpc_address || "—"),
      h("td", {}, i.heartbeat_ms ? formatDuration(i.heartbeat_age_ms) : "—"),
      h("td", { class: "num" }, String(i.jobs_led || 0)),
      h("td", { class: "num" }, String(i.workers || 0)),
      h("td", {}, schedulerControl(scope, i))));
    return tableEl({ class: "compact" },
      ["Instance", "Role", "Status", "gRPC", "Heartbeat age", num("Jobs led"), num("Workers"), "Scheduler"],
      rows.length ? rows : emptyRow(8, "No server instance known."));
  }

  function schedulerControl(scope, instance) {
    const paused = Boolean(instance.paused);
    const button = h("button", { type: "button", class: "small writes" }, paused ? "Resume" : "Pause");
    button.addEventListener("click", async () => {
      const what = `${paused ? "Resume" : "Pause"} the scheduler on ${instance.id}?`;
      if (!paused && !(await confirmAction(`${what} No detection runs while it is paused.`, "Pause"))) return;
      button.disabled = true;
      try {
        await scope.api("POST", `/api/scheduler/${paused ? "resume" : "pause"}?instance=${encodeURIComponent(instance.id)}`);
      } catch (e) {
        button.after(h("span", { class: "error-text", role: "alert" }, ` ${e.message}`));
      }
    });
    return [h("span", {}, paused ? "paused " : "active "), button];
  }

  function lastRecovery(recovery) {
    if (!recovery) return h("p", { class: "muted" }, "No recovery check has run since this server started.");
    const findings = recovery.findings || [];
    const line = h("p", {}, `At ${formatTime(recovery.at_ms)}: `,
      findings.length ? `${findings.length} finding${findings.length === 1 ? "" : "s"}. ` : "nothing to recover. ",
      link("/recovery", "Open recovery"));
    if (!findings.length) return line;
    return [line, h("ul", { class: "findings" }, findings.slice(0, 20).map((f) => findingItem(f, true)))];
  }

  /** Activity entries, newest first. */
  function activityItems(activities, emptyText) {
    if (!activities.length) return [h("li", { class: "muted" }, emptyText)];
    const sorted = [...activities].sort((a, b) => (b.at_ms || 0) - (a.at_ms || 0));
    return sorted.map((a, i) => h("li", { "data-key": `${a.at_ms}:${i}` },
      timeEl(a.at_ms), " ",
      a.job_type ? h("span", { class: "tag" }, typeLink(a.job_type)) : "", " ",
      h("span", {}, a.message || "")));
  }

  // ------------------------------------------------------------- jobs list

  const PAGE_SIZE = 50;

  function renderJobs(scope, _params, query) {
    const view = {
      state: query.get("state") || "",
      name: query.get("name") || "",
      origin: query.get("origin") || "",
      before: "",
      earlier: [],
      next: null,
      shown: "",
      asked: 0,
    };
    const { head, notice, updated } = pageHead("Jobs");
    const filters = jobFilters(view, () => reloadJobs(scope, view, parts));
    const body = h("tbody");
    const table = h("div", { class: "table-wrap" }, h("table", { id: "jobs" },
      headRow(["State", "Name", "ID", num("Tasks"), "Origin", "Created", "Finished", num("Took")]), body));
    const prev = h("button", { type: "button", id: "prev-page", disabled: true }, "← Newer");
    const next = h("button", { type: "button", id: "next-page", disabled: true }, "Older →");
    const pageInfo = h("span", { class: "muted" });
    const parts = { body, prev, next, pageInfo, updated };
    prev.addEventListener("click", () => turnPage(scope, view, parts, -1));
    next.addEventListener("click", () => turnPage(scope, view, parts, 1));
    append(pageEl, head, notice, filters, table, h("div", { class: "pager" }, prev, pageInfo, next));
    keepLoading(scope, 2000, () => loadJobs(scope, view, parts), notice);
  }

  function jobFilters(view, changed) {
    const state = h("select", { id: "filter-state", name: "state" },
      h("option", { value: "" }, "all states"),
      JOB_STATES.map((s) => h("option", { value: s }, stateLabel(s))));
    const origin = h("select", { id: "filter-origin", name: "origin" },
      h("option", { value: "" }, "any origin but recovery checks"),
      h("option", { value: "submitted" }, "submitted"),
      h("option", { value: "scheduler" }, "scheduler"),
      h("option", { value: "recovery" }, "recovery checks"),
      h("option", { value: "all" }, "all, recovery checks too"));
    const name = h("input", { id: "filter-name", name: "name", type: "search", placeholder: "part of the name", autocomplete: "off" });
    state.value = view.state;
    origin.value = view.origin;
    name.value = view.name;
    let typing = null;
    const apply = () => {
      clearTimeout(typing);
      Object.assign(view, { state: state.value, origin: origin.value, name: name.value.trim() });
      changed();
    };
    state.addEventListener("change", apply);
    origin.addEventListener("change", apply);
    name.addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(apply, 300);
    });
    const form = h("form", { class: "filters", role: "search", "aria-label": "Filter jobs" },
      h("label", { for: "filter-state" }, h("span", {}, "State"), state),
      h("label", { for: "filter-name" }, h("span", {}, "Name"), name),
      h("label", { for: "filter-origin" }, h("span", {}, "Origin"), origin));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      apply();
    });
    return form;
  }

  function jobsQuery(view) {
    const q = new URLSearchParams();
    if (view.state) q.set("state", view.state);
    if (view.name) q.set("name", view.name);
    if (view.origin) q.set("origin", view.origin);
    return q;
  }

  function reloadJobs(scope, view, parts) {
    view.before = "";
    view.earlier = [];
    const q = jobsQuery(view).toString();
    history.replaceState(null, "", q ? `#/jobs?${q}` : "#/jobs");
    return loadJobs(scope, view, parts).catch((e) => showJobsError(parts, e));
  }

  function turnPage(scope, view, parts, direction) {
    if (direction > 0 && view.next) {
      view.earlier.push(view.before);
      view.before = view.next;
    } else if (direction < 0 && view.earlier.length) {
      view.before = view.earlier.pop();
    } else {
      return;
    }
    loadJobs(scope, view, parts).catch((e) => showJobsError(parts, e));
  }

  function showJobsError(parts, error) {
    if (error.status !== 401) parts.body.replaceChildren(emptyRow(8, `Could not list jobs: ${error.message}`));
  }

  async function loadJobs(scope, view, parts) {
    const q = jobsQuery(view);
    q.set("limit", String(PAGE_SIZE));
    if (view.before) q.set("before", view.before);
    const asked = ++view.asked;
    const data = await scope.api("GET", `/api/jobs?${q}`);
    if (asked !== view.asked) return;
    const jobs = data.jobs || [];
    view.next = data.next || null;
    parts.prev.disabled = view.earlier.length === 0;
    parts.next.disabled = !view.next;
    parts.pageInfo.textContent = `Page ${view.earlier.length + 1} · ${jobs.length} job${jobs.length === 1 ? "" : "s"}`;
    touch(parts.updated);
    const shown = JSON.stringify([q.toString(), jobs]);
    if (shown === view.shown) return;
    view.shown = shown;
    const rows = jobs.map(jobRow);
    replaceKeepingFocus(parts.body, rows.length ? rows : [emptyRow(8, "No job matches.")]);
  }

  function jobRow(job) {
    const took = job.finished_at_ms && job.created_at_ms ? formatDuration(job.finished_at_ms - job.created_at_ms) : "—";
    return h("tr", { "data-job": job.id },
      stateBadge(job.state, "td"),
      h("td", { class: "name" }, link(`/jobs/${encodeURIComponent(job.id)}`, job.name || "(unnamed)")),
      h("td", { class: "mono", title: job.id }, shortId(job.id)),
      h("td", { class: "num" }, String(job.tasks ?? "")),
      h("td", {}, originEl(job.origin)),
      h("td", {}, timeEl(job.created_at_ms)),
      h("td", {}, timeEl(job.finished_at_ms)),
      h("td", { class: "num" }, took));
  }

  /** `user`, `recovery`, or `scheduler:<job type>:<sequence>` with a link to the type. */
  function originEl(origin) {
    if (!origin) return h("span", { class: "muted" }, "—");
    const parts = origin.split(":");
    if (parts[0] === "scheduler" && parts.length >= 2) {
      return h("span", {}, "scheduler · ", typeLink(parts[1]), parts[2] ? ` #${parts.slice(2).join(":")}` : "");
    }
    if (parts[0] === "schedule" && parts.length >= 2) {
      return h("span", {}, "schedule · ", h("a", { href: "#/schedules" }, parts[1]), parts[2] ? ` @ ${parts.slice(2).join(":")}` : "");
    }
    return h("span", {}, origin);
  }

  // -------------------------------------------------------------- one job

  function renderJob(scope, [jobId]) {
    const jobPage = window.JobPage;
    if (!jobPage || typeof jobPage.mount !== "function") {
      const { head } = pageHead("Job");
      append(pageEl, head, errorBox(new Error("The job view (graph.js) is not available.")),
        h("p", {}, jobLink(jobId, jobId), " · ", link("/jobs", "Back to the jobs")));
      return;
    }
    scope.onLeave(() => {
      if (typeof jobPage.unmount === "function") jobPage.unmount();
    });
    const ctx = {
      api,
      confirm: confirmAction,
      navigate,
      formatTime,
      formatDuration,
      formatAge,
      stateLabel,
      loaded: () => markLoaded(scope),
      later: (ms, fn) => scope.later(ms, fn),
    };
    try {
      const mounted = jobPage.mount(pageEl, jobId, ctx);
      if (mounted && typeof mounted.then === "function") {
        mounted.then(() => markLoaded(scope), (e) => showMountError(scope, e));
      }
    } catch (e) {
      showMountError(scope, e);
    }
  }

  function showMountError(scope, error) {
    if (!scope.alive || error.status === 401) return;
    append(pageEl, errorBox(error));
  }

  // ---------------------------------------------------------------- submit

  const FORMATS = { json: "json", toml: "toml", yaml: "yaml", yml: "yaml" };

  function renderSubmit(scope) {
    const { head } = pageHead("Submit a job");
    const state = { sourceName: "" };
    const file = h("input", { id: "job-file", type: "file", accept: ".json,.toml,.yaml,.yml,application/json,text/plain" });
    const format = h("select", { id: "job-format", name: "format" },
      ["json", "toml", "yaml"].map((f) => h("option", { value: f }, f.toUpperCase())));
    const text = h("textarea", { id: "job-text", name: "job", rows: "16", spellcheck: "false",
      placeholder: '{"name": "example", "tasks": [{"id": "first", "job_type": "noop"}]}' });
    const submit = h("button", { type: "submit", id: "submit-job", class: "primary" }, "Submit job");
    const result = h("div", { id: "submit-result", role: "status" });
    const error = h("div", { id: "submit-error", role: "alert", hidden: true });
    const problems = h("ul", { id: "problems", hidden: true });
    file.addEventListener("change", () => loadJobFile(file, text, format, state));
    for (const event of ["input", "change"]) text.addEventListener(event, () => forgetEmptiedFile(file, text, state));
    const form = h("form", { id: "submit-form", class: "submit-form writes" },
      h("div", { class: "row" },
        h("label", { for: "job-file" }, "Job file"), file,
        h("label", { for: "job-format" }, "Format"), format),
      h("label", { for: "job-text" }, "Job"), text,
      h("div", { class: "actions" }, submit, h("span", { class: "muted" }, "Ctrl+Enter submits. The job is checked first; nothing is stored when it is refused.")),
      result, error, problems);
    const readOnly = h("p", { id: "submit-read-only", class: "read-only-note muted" },
      "Your role may read only: submitting a job needs the role operator.");
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      submitJob(scope, { text, format, submit, result, error, problems }, state);
    });
    text.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
    });
    append(pageEl, head, readOnly, form);
    markLoaded(scope);
  }

  async function loadJobFile(file, text, format, state) {
    const chosen = file.files && file.files[0];
    if (!chosen) return;
    const extension = (chosen.name.split(".").pop() || "").toLowerCase();
    if (FORMATS[extension]) format.value = FORMATS[extension];
    text.value = await chosen.text();
    state.sourceName = chosen.name;
  }

  /** An emptied text is no longer the loaded file's. */
  function forgetEmptiedFile(file, text, state) {
    if (text.value !== "") return;
    state.sourceName = "";
    file.value = "";
  }

  async function submitJob(scope, parts, state) {
    const { text, format, submit, result, error, problems } = parts;
    result.replaceChildren();
    showNotice(error, "");
    problems.replaceChildren();
    problems.hidden = true;
    submit.disabled = true;
    const q = new URLSearchParams({ format: format.value });
    if (state.sourceName) q.set("name", state.sourceName);
    try {
      const answer = await scope.api("POST", `/api/jobs?${q}`, text.value);
      const path = `/jobs/${encodeURIComponent(answer.job_id)}`;
      append(result, h("p", { class: "ok-text" }, "Submitted: ",
        link(path, answer.job_id, { class: "job-link mono" })));
    } catch (e) {
      if (e.status !== 401) showSubmitProblems(e, parts);
    } finally {
      submit.disabled = false;
    }
  }

  function showSubmitProblems(e, parts) {
    const { text, error, problems } = parts;
    showNotice(error, `${e.message} — nothing was stored.`);
    const list = (e.body && e.body.problems) || [];
    problems.hidden = list.length === 0;
    problems.replaceChildren(...list.map((p) => problemItem(p, text)));
  }

  /** One problem: a task's own with a button that finds the task in the text. */
  function problemItem(problem, text) {
    if (problem.task === null || problem.task === undefined || problem.task === "") {
      return h("li", {}, problem.message);
    }
    const show = h("button", { type: "button", class: "small quiet" }, "show in text");
    show.addEventListener("click", () => selectTask(text, problem.task));
    return h("li", { "data-task": problem.task },
      h("span", { class: "tag mono" }, problem.task), " ", problem.message, " ", show);
  }

  /** Selects where the job text defines the task `id` (JSON, TOML or YAML). */
  function selectTask(text, id) {
    const quoted = id.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    const pattern = new RegExp(`["']?\\bid["']?\\s*[:=]\\s*["']?${quoted}(?![\\w.-])["']?`);
    const found = pattern.exec(text.value);
    text.focus();
    if (!found) return;
    text.setSelectionRange(found.index, found.index + found[0].length);
    const line = text.value.slice(0, found.index).split("\n").length;
    text.scrollTop = Math.max(0, (line - 3) * parseFloat(getComputedStyle(text).lineHeight || "16"));
  }

  // --------------------------------------------------------------- workers

  // Workers a page of the Workers page shows.
  const WORKERS_PAGE = 100;

  function renderWorkers(scope) {
    const { head, notice, updated } = pageHead("Workers");
    const body = h("tbody");
    const table = h("div", { class: "table-wrap" }, h("table", { id: "workers" },
      headRow(["Worker", "Handler", "Last heartbeat", "Execution slots", "Detection slots",
        "Job types", "Runs now", "Version", "Connected"]), body));
    // A page of the workers at a time, in the order of their ids: an
    // admin may hold thousands.
    const view = { offset: 0, total: 0, asked: 0 };
    const prev = h("button", { type: "button", id: "workers-prev", disabled: true }, "← Previous");
    const next = h("button", { type: "button", id: "workers-next", disabled: true }, "Next →");
    const pageInfo = h("span", { class: "muted", id: "workers-page" });
    const load = async () => {
      const asked = ++view.asked;
      const data = await scope.api("GET", `/api/workers?offset=${view.offset}&limit=${WORKERS_PAGE}`);
      if (asked !== view.asked) return;
      const workers = data.workers || [];
      view.total = data.total || 0;
      if (view.offset > 0 && view.offset >= view.total) {
        view.offset = Math.max(0, Math.floor((view.total - 1) / WORKERS_PAGE) * WORKERS_PAGE);
        return load();
      }
      const rows = workers.map(workerRow);
      replaceKeepingFocus(body, rows.length ? rows : [emptyRow(9, "No worker is connected.")]);
      prev.disabled = view.offset === 0;
      next.disabled = view.offset + workers.length >= view.total;
      pageInfo.textContent = workers.length
        ? `${view.offset + 1}–${view.offset + workers.length} of ${view.total} worker${view.total === 1 ? "" : "s"}`
        : "";
      touch(updated);
    };
    const turn = (by) => {
      view.offset = Math.max(0, view.offset + by * WORKERS_PAGE);
      load().catch(() => {});
    };
    prev.addEventListener("click", () => turn(-1));
    next.addEventListener("click", () => turn(1));
    append(pageEl, head, notice, table, h("div", { class: "pager" }, prev, pageInfo, next));
    keepLoading(scope, 2000, load, notice);
  }

  function workerRow(w) {
    return h("tr", { "data-worker": w.worker_id },
      h("th", { scope: "row", class: "mono" }, w.worker_id, w.address ? h("div", { class: "muted" }, w.address) : ""),
      h("td", { class: "mono small-text" }, w.handler || "—"),
      h("td", {}, timeEl(w.last_heartbeat_ms, true), h("div", { class: "muted" }, `${w.heartbeats || 0} beats`)),
      h("td", {}, slots(w.execution_slots_used, w.execution_slots_total), w.held_attempts ? h("div", { class: "muted" }, `${w.held_attempts} held`) : ""),
      h("td", {}, slots(w.detection_slots_used, w.detection_slots_total)),
      h("td", {}, capabilityList(w.capabilities || [])),
      h("td", {}, runningList(w.running || [])),
      h("td", {}, w.version || "—"),
      h("td", {}, timeEl(w.connected_at_ms, true)));
  }

  function slots(used, total) {
    used = used || 0;
    total = total || 0;
    return h("span", { class: "slots" },
      h("meter", { min: "0", max: String(Math.max(total, 1)), value: String(used), "aria-hidden": "true" }),
      ` ${used} / ${total}`);
  }

  function capabilityList(capabilities) {
    if (!capabilities.length) return h("span", { class: "muted" }, "none");
    return h("ul", { class: "plain" }, capabilities.map((c) => h("li", {},
      typeLink(c.job_type), " ",
      c.can_detect ? h("span", { class: "tag", title: `up to ${c.max_detection_concurrency} at once` }, `detect ×${c.max_detection_concurrency}`) : "",
      " ",
      c.can_execute ? h("span", { class: "tag", title: `up to ${c.max_execution_concurrency} at once` }, `execute ×${c.max_execution_concurrency}`) : "")));
  }

  function runningList(running) {
    if (!running.length) return h("span", { class: "muted" }, "idle");
    return h("ul", { class: "plain" }, running.map((r) => {
      const bits = [r.job_type, r.attempt ? `attempt ${r.attempt}` : "", r.stage,
        r.progress_percent ? `${Math.round(r.progress_percent)}%` : ""].filter(Boolean);
      return h("li", {}, r.state ? stateBadge(r.state) : "", " ",
        jobLink(r.job_id), " / ", h("span", { class: "mono" }, r.task_id),
        bits.length ? h("span", { class: "muted" }, ` (${bits.join(", ")})`) : "");
    }));
  }

  // ------------------------------------------------------------ job types

  function renderTypes(scope) {
    const { head, notice, updated } = pageHead("Job types");
    const body = h("tbody");
    const table = h("div", { class: "table-wrap" }, h("table", { id: "types" },
      headRow(["Job type", "Name", "Description", num("Detectors"), num("Executors"), "Descriptor", "Window"]), body));
    append(pageEl, head, notice, table);
    keepLoading(scope, 5000, async () => {
      const [data, windows] = await Promise.all([scope.api("GET", "/api/job-types"), scope.api("GET", "/api/windows")]);
      const byType = new Map((windows.windows || []).map((w) => [w.job_type, w]));
      const types = (data.job_types || []).map((t) => ({ ...t, window: byType.get(t.job_type) || null }));
      renderIfChanged(body, types, typeRows);
      touch(updated);
    }, notice);
  }

  /** A job type's maintenance window: open or closed now, and its next change, in its windows' time zone. */
  function windowCell(w) {
    if (!w) return h("td", { class: "window" }, h("span", { class: "muted" }, "—"));
    if (w.windows === "always" && w.blackouts === "none") {
      return h("td", { class: "window" }, h("span", { class: "muted" }, "always open"));
    }
    const next = w.open
      ? (w.next_close_ms ? `closes ${w.next_close_local}` : "stays open")
      : (w.next_open_ms ? `opens ${w.next_open_local}` : "not open within 400 days");
    const terms = `windows: ${w.windows}; blackouts: ${w.blackouts}; on close: ${w.on_window_close}`;
    return h("td", { class: "window", title: terms },
      h("span", { class: "tag", "data-window": w.open ? "open" : "closed" }, w.open ? "open" : "closed"), " ", next);
  }

  function typeRows(types) {
    const rows = types.map((t) => h("tr", { "data-type": t.job_type },
        h("th", { scope: "row" }, typeLink(t.job_type)),
        h("td", {}, t.display_name || ""),
        h("td", {}, t.description || ""),
        h("td", { class: "num" }, String(t.detectors || 0)),
        h("td", { class: "num" }, String(t.executors || 0)),
        h("td", {}, t.has_descriptor ? "✓ yes" : "— no"),
        windowCell(t.window)));
    return rows.length ? rows : [emptyRow(7, "No job type known yet: connect a worker.")];
  }

  // ------------------------------------------------------ one job type

  const POLICY_SECTIONS = [
    ["Detection", [
      ["detection_enabled", "Detection enabled", "bool"],
      ["detection_interval_seconds", "Detection interval", "seconds"],
      ["detection_timeout_seconds", "Detection timeout", "seconds"],
      ["max_jobs_per_detection", "Most jobs per detection", "count"],
    ]],
    ["Execution", [
      ["global_execution_concurrency", "Executions at once, in all", "count"],
      ["per_worker_execution_concurrency", "Executions at once, per worker", "count"],
      ["retry_limit", "Retries", "count"],
      ["retry_backoff_seconds", "Wait before a retry", "seconds"],
      ["execution_timeout_seconds", "Execution timeout (0: none)", "seconds"],
      ["job_type_max_runtime_seconds", "Longest run", "seconds"],
    ]],
  ];

  const UINT32_MAX = 4294967295;

  function renderType(scope, [jobType]) {
    const { head, notice, heading } = pageHead(jobType);
    const intro = h("div", { class: "type-intro" });
    const formBox = h("div");
    const detect = detectBox(scope, jobType);
    const runs = h("div", { id: "runs" });
    const activities = h("ol", { id: "activities", class: "log" });
    append(pageEl, h("p", { class: "crumbs" }, link("/types", "Job types"), " / ", jobType),
      head, notice, intro, formBox, detect,
      h("section", {}, h("h2", {}, "Detection runs"), runs),
      h("section", {}, h("h2", {}, "Activity"), activities));
    loadTypeForm(scope, jobType, { heading, intro, formBox, notice }).then(() => keepLoading(scope, 5000, async () => {
      const [history, log] = await Promise.all([
        scope.api("GET", `/api/runs/${encodeURIComponent(jobType)}`),
        scope.api("GET", `/api/activities?job_type=${encodeURIComponent(jobType)}&limit=100`),
      ]);
      renderIfChanged(runs, history, runsTables);
      renderIfChanged(activities, log.activities || [], (list) => activityItems(list, "No activity for this job type yet."));
    }, notice));
  }

  async function loadTypeForm(scope, jobType, parts) {
    try {
      const data = await scope.api("GET", `/api/job-types/${encodeURIComponent(jobType)}`);
      const descriptor = data.descriptor || null;
      if (descriptor && descriptor.display_name && descriptor.display_name !== jobType) {
        parts.heading.textContent = `${descriptor.display_name} (${jobType})`;
      }
      parts.intro.replaceChildren(typeIntro(descriptor));
      parts.formBox.replaceChildren(policyForm(scope, jobType, data.policy || {}, descriptor));
      markLoaded(scope);
    } catch (e) {
      if (e.status !== 401) parts.formBox.replaceChildren(errorBox(e));
    }
  }

  function typeIntro(descriptor) {
    if (!descriptor) return h("p", { class: "muted" }, "No worker has described this job type: only the admin policy can be set.");
    return h("p", {}, descriptor.description || "",
      descriptor.descriptor_version ? h("span", { class: "muted" }, ` (descriptor version ${descriptor.descriptor_version})`) : "");
  }

  /** The policy form: the admin policy, then the worker's configuration forms. */
  function policyForm(scope, jobType, policy, descriptor) {
    const form = h("form", { id: "policy-form", class: "policy", novalidate: true });
    const fields = [];
    for (const [title, keys] of POLICY_SECTIONS) {
      const set = h("fieldset", {}, h("legend", {}, title));
      for (const spec of keys) {
        const field = policyField(spec, policy);
        fields.push(field);
        set.append(field.row);
      }
      form.append(set);
    }
    const workerForm = descriptor && descriptor.worker_config_form;
    if (workerForm) {
      const built = configForm(workerForm, workerValues(policy, descriptor), "worker.", "Worker configuration");
      fields.push(...built.fields);
      form.append(built.el);
    }
    const adminForm = descriptor && descriptor.admin_config_form;
    if (adminForm) form.append(configForm(adminForm, formDefaults(adminForm), null, "Detector configuration (from the descriptor)").el);
    const saved = h("span", { id: "policy-saved", class: "ok-text", role: "status", hidden: true }, "✓ Saved.");
    const error = h("div", { id: "policy-error", class: "error-text", role: "alert", hidden: true });
    const save = h("button", { type: "submit", id: "save-policy", class: "primary writes" }, "Save");
    form.append(h("div", { class: "actions sticky-actions" }, save, saved), error);
    form.addEventListener("input", () => { saved.hidden = true; applyVisibility(form); });
    form.addEventListener("change", () => applyVisibility(form));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      savePolicy(scope, jobType, form, fields, { saved, error, save });
    });
    applyVisibility(form);
    return h("section", {}, h("h2", {}, "Policy"), form);
  }

  function sourceText(source) {
    return source === "set" ? "operator" : source || "default";
  }

  /** One admin policy value: its input, its source and a way back to the default. */
  function policyField([key, label, kind], policy) {
    const id = `policy-${key}`;
    const value = policy[key];
    const input = kind === "bool"
      ? h("input", { id, name: key, type: "checkbox", ".checked": Boolean(value) })
      : h("input", { id, name: key, type: "number", min: "0", max: String(UINT32_MAX), step: "1", required: true,
        inputmode: "numeric", value: String(value ?? ""), "aria-describedby": `${id}-hint ${id}-error` });
    const hint = h("span", { id: `${id}-hint`, class: "muted" }, kind === "seconds" ? durationHint(value) : "");
    const source = h("span", { class: "source", "data-source-for": key }, sourceText((policy.sources || {})[key]));
    const error = h("span", { id: `${id}-error`, class: "field-error", hidden: true });
    const reset = resetButton(key, input);
    reset.hidden = source.textContent !== "operator";
    if (kind === "seconds") input.addEventListener("input", () => { hint.textContent = durationHint(input.value); });
    const row = h("div", { class: "field" }, h("label", { for: id }, label), h("div", { class: "control" }, input, hint),
      h("div", { class: "meta" }, source, reset), error);
    return { key, input, kind, error, source, reset, initial: readInput(input, kind), row };
  }

  function durationHint(value) {
    const n = Number(value);
    if (!Number.isFinite(n) || n < 60 || value === "") return "s";
    return `s = ${formatDuration(n * 1000)}`;
  }

  function resetButton(key, input) {
    const button = h("button", { type: "button", class: "small quiet reset", "aria-label": `Reset ${key} to its default`, hidden: true }, "reset");
    button.addEventListener("click", () => {
      input.dataset.reset = "1";
      input.closest("form").requestSubmit();
    });
    return button;
  }

  function readInput(input, kind) {
    if (input.type === "checkbox") return input.checked;
    if (input.tagName === "SELECT" && input.multiple) return [...input.selectedOptions].map((o) => o.value);
    if (kind === "list") return input.value.split("\n").map((s) => s.trim()).filter(Boolean);
    return input.value.trim();
  }

  /** The changes to send: values that differ from what was loaded ("default" for a cleared one). */
  function collectChanges(fields) {
    const changes = {};
    for (const field of fields) {
      if (field.readOnly) continue;
      if (field.input.dataset.reset === "1") {
        changes[field.key] = "default";
        continue;
      }
      const now = readInput(field.input, field.kind);
      if (JSON.stringify(now) === JSON.stringify(field.initial)) continue;
      changes[field.key] = now === "" ? "default" : toSent(now, field.kind);
    }
    return changes;
  }

  function toSent(value, kind) {
    if (typeof value === "boolean" || Array.isArray(value)) return value;
    if (["count", "seconds", "int", "double"].includes(kind)) return Number(value);
    return value;
  }

  /** Checks every field against its bounds; shows each problem beside its field. */
  function validateFields(fields) {
    let first = null;
    for (const field of fields) {
      const input = field.input;
      const message = input.checkValidity ? fieldProblem(input) : "";
      field.error.textContent = message;
      field.error.hidden = !message;
      input.setAttribute("aria-invalid", message ? "true" : "false");
      if (message && !first) first = input;
    }
    if (first) first.focus();
    return !first;
  }

  function fieldProblem(input) {
    if (input.closest("[hidden]") || input.disabled) return "";
    if (input.dataset.reset === "1") return "";
    if (input.checkValidity()) return "";
    const v = input.validity;
    if (v.valueMissing) return "A value is required.";
    if (v.rangeUnderflow) return `At least ${input.min}.`;
    if (v.rangeOverflow) return `At most ${input.max}.`;
    if (v.stepMismatch) return input.step === "1" ? "A whole number." : input.validationMessage;
    if (v.badInput) return "Not a number.";
    return input.validationMessage;
  }

  async function savePolicy(scope, jobType, form, fields, parts) {
    parts.saved.hidden = true;
    showNotice(parts.error, "");
    if (!validateFields(fields)) return;
    const changes = collectChanges(fields);
    fields.forEach((f) => delete f.input.dataset.reset);
    if (!Object.keys(changes).length) {
      parts.saved.textContent = "Nothing changed.";
      parts.saved.hidden = false;
      return;
    }
    parts.save.disabled = true;
    try {
      const policy = await scope.api("PUT", `/api/policies/${encodeURIComponent(jobType)}`, changes);
      refreshPolicyFields(fields, policy);
      parts.saved.textContent = "✓ Saved.";
      parts.saved.hidden = false;
    } catch (e) {
      if (e.status !== 401) showNotice(parts.error, `Not saved: ${e.message}`);
    } finally {
      parts.save.disabled = false;
    }
  }

  /** Shows a policy the server answered with: values, sources, initial values. */
  function refreshPolicyFields(fields, policy) {
    const sources = policy.sources || {};
    const workerConfig = policy.worker_config || {};
    for (const field of fields) {
      if (field.key.startsWith("worker.")) {
        const name = field.key.slice("worker.".length);
        writeConfigInput(field, name in workerConfig ? parseConfigText(workerConfig[name]) : field.defaultValue);
      } else if (field.key in policy) {
        if (field.input.type === "checkbox") field.input.checked = Boolean(policy[field.key]);
        else field.input.value = String(policy[field.key]);
        field.source.textContent = sourceText(sources[field.key]);
        field.reset.hidden = sourceText(sources[field.key]) !== "operator";
      }
      field.initial = readInput(field.input, field.kind);
      if (field.refreshSource) field.refreshSource();
    }
  }

  // ------------------------------------------- descriptor configuration forms

  /** A typed value `{"<kind>": value}` as a plain value. */
  function configValue(v) {
    if (v === null || v === undefined || typeof v !== "object") return v;
    const entries = Object.entries(v);
    if (!entries.length) return undefined;
    const [, value] = entries[0];
    if (value && typeof value === "object" && Array.isArray(value.values)) return value.values;
    return value;
  }

  /** A worker configuration value as the policy holds it (JSON text). */
  function parseConfigText(text) {
    if (typeof text !== "string") return text;
    try {
      return JSON.parse(text);
    } catch (_) {
      return text;
    }
  }

  function formDefaults(form) {
    const out = {};
    for (const [name, v] of Object.entries(form.default_values || {})) out[name] = configValue(v);
    return out;
  }

  /** The values to show: the form's defaults, the descriptor's, then what the policy holds. */
  function workerValues(policy, descriptor) {
    const values = formDefaults(descriptor.worker_config_form || {});
    for (const [name, v] of Object.entries(descriptor.worker_default_values || {})) values[name] = configValue(v);
    const defaults = { ...values };
    for (const [name, text] of Object.entries(policy.worker_config || {})) values[name] = parseConfigText(text);
    return { values, defaults };
  }

  /**
   * A descriptor's ConfigForm as fieldsets of inputs. With `prefix` the
   * inputs are named `<prefix><field name>` and saved; without, they are shown read-only.
   */
  function configForm(form, valueSet, prefix, fallbackTitle) {
    const { values, defaults } = valueSet.values ? valueSet : { values: valueSet, defaults: valueSet };
    const el = h("div", { class: "config-form", "data-form": form.form_id || "" },
      h("h3", {}, form.title || fallbackTitle),
      form.description ? h("p", { class: "muted" }, form.description) : "");
    const fields = [];
    for (const section of form.sections || []) {
      const set = h("fieldset", { "data-section": section.section_id || "" },
        h("legend", {}, section.title || section.section_id || "Settings"),
        section.description ? h("p", { class: "muted" }, section.description) : "");
      for (const field of section.fields || []) {
        const built = configField(field, values[field.name], defaults[field.name], prefix);
        if (prefix) fields.push(built);
        set.append(built.row);
      }
      el.append(set);
    }
    return { el, fields };
  }

  /** What input a field needs, from its type and its widget. */
  function fieldKind(field) {
    const type = (field.field_type || "").replace("CONFIG_FIELD_TYPE_", "");
    const widget = (field.widget || "").replace("CONFIG_WIDGET_", "");
    if (type === "BOOL" || widget === "TOGGLE") return "bool";
    if (widget === "MULTI_SELECT" || (type === "LIST" && (field.options || []).length)) return "multi";
    if (type === "ENUM" || widget === "SELECT") return "select";
    if (type === "LIST") return "list";
    if (type === "INT64") return "int";
    if (type === "DOUBLE") return "double";
    if (type === "DURATION" || widget === "DURATION") return "duration";
    if (type === "OBJECT" || type === "BYTES" || widget === "TEXTAREA") return "textarea";
    if (widget === "NUMBER") return "double";
    return "text";
  }

  function configField(field, value, defaultValue, prefix) {
    const kind = fieldKind(field);
    const name = prefix ? `${prefix}${field.name}` : null;
    const id = `cfg-${prefix ? "w" : "a"}-${field.name}`;
    const input = configInput(field, kind, id, name);
    const entry = { key: name, input, kind, readOnly: !prefix || field.read_only, defaultValue };
    writeConfigInput(entry, value === undefined ? defaultValue : value);
    if (!prefix || field.read_only) input.disabled = true;
    const error = h("span", { id: `${id}-error`, class: "field-error", hidden: true });
    const source = h("span", { class: "source", "data-source-for": name || field.name });
    const reset = prefix && !field.read_only ? resetButton(name, input) : h("span");
    entry.refreshSource = () => {
      const same = JSON.stringify(readInput(input, kind)) === JSON.stringify(normalize(defaultValue, kind));
      source.textContent = !prefix ? "descriptor" : same ? "default" : "operator";
      reset.hidden = source.textContent !== "operator";
    };
    entry.refreshSource();
    const help = [field.description, field.help_text].filter(Boolean).join(" ");
    const row = h("div", { class: "field", "data-field-name": field.name,
      "data-visible-when": field.visible_when_field || null,
      "data-visible-equals": field.visible_when_field ? JSON.stringify(configValue(field.visible_when_equals)) : null },
    h("label", { for: id }, field.label || field.name, field.required ? h("span", { class: "req", title: "required" }, " *") : ""),
    h("div", { class: "control" }, input,
      help ? h("span", { id: `${id}-help`, class: "muted help" }, help) : "",
      defaultValue !== undefined && prefix ? h("span", { class: "muted help" }, `default: ${showValue(defaultValue)}`) : ""),
    h("div", { class: "meta" }, source, reset), error);
    input.setAttribute("aria-describedby", `${id}-help ${id}-error`);
    return Object.assign(entry, { error, source, reset, row, initial: readInput(input, kind) });
  }

  function configInput(field, kind, id, name) {
    const common = { id, name, required: field.required && kind !== "bool", placeholder: field.placeholder || null };
    const min = configValue(field.min_value);
    const max = configValue(field.max_value);
    switch (kind) {
      case "bool":
        return h("input", { ...common, type: "checkbox" });
      case "select":
        return h("select", common,
          field.required ? "" : h("option", { value: "" }, "(not set)"),
          (field.options || []).map((o) => h("option", { value: o.value, disabled: o.disabled, title: o.description || null }, o.label || o.value)));
      case "multi":
        return h("select", { ...common, multiple: true, size: String(Math.min(6, (field.options || []).length || 1)) },
          (field.options || []).map((o) => h("option", { value: o.value, disabled: o.disabled }, o.label || o.value)));
      case "list":
        return h("textarea", { ...common, rows: "3", placeholder: field.placeholder || "one value a line" });
      case "int":
      case "double":
        return h("input", { ...common, type: "number", step: kind === "int" ? "1" : "any",
          min: min === undefined || min === null ? null : String(min), max: max === undefined || max === null ? null : String(max) });
      case "duration":
        return h("input", { ...common, type: "text", pattern: "\\d+(\\.\\d+)?(ms|s|m|h)?|(\\d+h)?(\\d+m)?(\\d+(\\.\\d+)?s)?",
          placeholder: field.placeholder || "e.g. 30s, 5m, 1h" });
      case "textarea":
        return h("textarea", { ...common, rows: "3" });
      default:
        return h("input", { ...common, type: field.sensitive || field.widget === "CONFIG_WIDGET_PASSWORD" ? "password" : "text",
          autocomplete: field.sensitive ? "off" : null });
    }
  }

  function normalize(value, kind) {
    if (kind === "bool") return Boolean(value);
    if (kind === "multi" || kind === "list") return Array.isArray(value) ? value.map(String) : [];
    if (value === undefined || value === null) return "";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function writeConfigInput(entry, value) {
    const { input, kind } = entry;
    if (kind === "bool") {
      input.checked = Boolean(value);
    } else if (kind === "multi") {
      const chosen = new Set(normalize(value, kind));
      for (const option of input.options) option.selected = chosen.has(option.value);
    } else if (kind === "list") {
      input.value = normalize(value, kind).join("\n");
    } else if (kind === "duration" && typeof value === "number") {
      input.value = `${value}s`;
    } else {
      input.value = normalize(value, kind);
    }
  }

  function showValue(value) {
    if (Array.isArray(value)) return value.length ? value.join(", ") : "(none)";
    if (value === "") return "(empty)";
    if (typeof value === "object" && value !== null) return JSON.stringify(value);
    return String(value);
  }

  /** Hides the fields whose `visible_when` condition does not hold. */
  function applyVisibility(form) {
    for (const row of form.querySelectorAll("[data-visible-when]")) {
      const other = row.parentElement.closest(".config-form").querySelector(`[data-field-name="${CSS.escape(row.dataset.visibleWhen)}"] :is(input,select,textarea)`);
      if (!other) continue;
      const wanted = JSON.parse(row.dataset.visibleEquals || "null");
      const now = other.type === "checkbox" ? other.checked : other.value;
      row.hidden = wanted !== null && String(now) !== String(wanted);
    }
  }

  // ---------------------------------------------- detection and run history

  function detectBox(scope, jobType) {
    const dry = h("button", { type: "button", id: "detect-dry", class: "writes" }, "Detect now (dry run)");
    const run = h("button", { type: "button", id: "detect-run", class: "writes" }, "Detect now and run…");
    const result = h("div", { id: "detect-result", "aria-live": "polite" });
    dry.addEventListener("click", () => detect(scope, jobType, false, { dry, run, result }));
    run.addEventListener("click", () => detect(scope, jobType, true, { dry, run, result }));
    return h("section", { class: "detect" }, h("h2", {}, "Detection"),
      h("p", { class: "muted" }, "A dry run shows what the detector proposes; nothing is submitted."),
      h("div", { class: "actions" }, dry, run), result);
  }

  async function detect(scope, jobType, run, parts) {
    if (run && !(await confirmAction(`Run detection for ${jobType} now and submit a job of what it proposes?`, "Detect and run"))) return;
    parts.dry.disabled = parts.run.disabled = true;
    parts.result.replaceChildren(h("p", { class: "muted" }, "Detecting…"));
    try {
      const answer = await scope.api("POST", `/api/detect/${encodeURIComponent(jobType)}?run=${run ? 1 : 0}`);
      parts.result.replaceChildren(...detectResult(answer, run));
    } catch (e) {
      if (e.status !== 401) parts.result.replaceChildren(errorBox(e));
    } finally {
      parts.dry.disabled = parts.run.disabled = false;
    }
  }

  function detectResult(answer, run) {
    const proposals = answer.proposals || [];
    const dropped = answer.dropped || [];
    const out = [h("p", {}, `${proposals.length} proposal${proposals.length === 1 ? "" : "s"}`,
      dropped.length ? `, ${dropped.length} dropped` : "", run ? "" : " (dry run)", ". ",
      answer.job_id ? ["Job: ", jobLink(answer.job_id, answer.job_id)] : run ? "No job was made." : "")];
    if (proposals.length) {
      out.push(tableEl({ class: "compact" }, ["Summary", "Priority", "Dedupe key", "Labels", "Parameters"],
        proposals.map((p) => h("tr", { "data-proposal": p.proposal_id },
          h("td", {}, p.summary || p.proposal_id),
          h("td", {}, p.priority || ""),
          h("td", { class: "mono" }, p.dedupe_key || ""),
          h("td", {}, labelsText(p.labels)),
          h("td", {}, h("code", { class: "params" }, p.parameters || ""))))));
    }
    if (dropped.length) {
      out.push(h("h3", {}, "Dropped"), h("ul", {}, dropped.map((d) => h("li", {},
        h("span", { class: "mono" }, d.proposal_id), ": ", d.reason))));
    }
    return out;
  }

  function labelsText(labels) {
    const entries = Object.entries(labels || {});
    return entries.length ? entries.map(([k, v]) => `${k}=${v}`).join(", ") : "—";
  }

  function runsTables(history) {
    const row = (r) => h("tr", {},
      h("td", {}, timeEl(r.at_ms)),
      h("td", { class: "num" }, formatDuration(r.duration_ms)),
      h("td", { class: "mono" }, r.detector || "—"),
      h("td", { class: "num" }, `${r.kept ?? 0} / ${r.proposals ?? 0}`),
      h("td", {}, r.job_id ? jobLink(r.job_id) : "—"),
      h("td", { class: r.error ? "error-text" : "" }, r.error || ""));
    const headers = ["At", num("Took"), "Detector", num("Kept / proposed"), "Job", "Error"];
    const newest = (list) => [...(list || [])].sort((a, b) => b.at_ms - a.at_ms);
    const succeeded = newest(history.succeeded);
    const failed = newest(history.failed);
    return h("div", { class: "runs" },
      h("h3", {}, stateBadge("succeeded"), ` (${succeeded.length})`),
      tableEl({ class: "compact", "data-runs": "succeeded" }, headers, succeeded.length ? succeeded.map(row) : emptyRow(6, "None yet.")),
      h("h3", {}, stateBadge("failed"), ` (${failed.length})`),
      tableEl({ class: "compact", "data-runs": "failed" }, headers, failed.length ? failed.map(row) : emptyRow(6, "None.")));
  }

  // -------------------------------------------------------------- recovery

  function renderRecovery(scope) {
    const { head, notice } = pageHead("Recovery");
    const dry = h("button", { type: "button", id: "recovery-dry-run", class: "writes" }, "Dry run");
    const run = h("button", { type: "button", id: "recovery-run", class: "danger writes" }, "Run now…");
    const summary = h("p", { class: "summary", role: "status" });
    const findings = h("div", { id: "findings" });
    const parts = { dry, run, summary, findings };
    dry.addEventListener("click", () => recover(scope, true, parts));
    run.addEventListener("click", () => recover(scope, false, parts));
    append(pageEl, head, notice,
      h("p", { class: "muted" }, "The recovery check looks for tasks whose workers are gone, attempts nobody holds and jobs whose state disagrees with their tasks. A dry run only reports; running applies the actions."),
      h("div", { class: "actions" }, dry, run), summary, findings);
    recover(scope, true, parts).then(() => markLoaded(scope));
  }

  async function recover(scope, dryRun, parts) {
    if (!dryRun && !(await confirmAction("Run the recovery check now and apply what it finds?", "Run recovery"))) return;
    parts.dry.disabled = parts.run.disabled = true;
    parts.summary.textContent = dryRun ? "Checking (dry run)…" : "Recovering…";
    try {
      const answer = await scope.api("POST", `/api/recover?dry_run=${dryRun ? 1 : 0}`);
      const list = answer.findings || [];
      parts.summary.textContent = `${answer.dry_run ? "Dry run" : "Run"} at ${formatClock(Date.now())}: ` +
        (list.length ? `${list.length} finding${list.length === 1 ? "" : "s"}.` : "nothing to recover.");
      parts.findings.replaceChildren(...findingGroups(list));
    } catch (e) {
      if (e.status !== 401) {
        parts.summary.textContent = "";
        parts.findings.replaceChildren(errorBox(e));
      }
    } finally {
      parts.dry.disabled = parts.run.disabled = false;
    }
  }

  /** Findings grouped by rule, each group with its count. */
  function findingGroups(findings) {
    if (!findings.length) return [h("p", { class: "muted" }, "No findings: every job and task is consistent.")];
    const groups = new Map();
    for (const f of findings) {
      if (!groups.has(f.rule)) groups.set(f.rule, []);
      groups.get(f.rule).push(f);
    }
    return [...groups].map(([rule, list]) => h("section", { class: "rule-group", "data-rule-group": rule },
      h("h2", {}, h("span", { class: "tag mono" }, rule), " ", list[0].rule_name || "", h("span", { class: "muted" }, ` · ${list.length}`)),
      h("ul", { class: "findings" }, list.map((f) => findingItem(f, false)))));
  }

  function findingItem(f, withRule) {
    return h("li", { "data-rule": f.rule },
      withRule ? [h("span", { class: "tag mono", title: f.rule_name || null }, f.rule), " "] : "",
      h("span", { class: f.applied ? "applied" : "proposed" }, f.applied ? "✓ applied" : "◷ proposed"), " ",
      h("strong", {}, f.action || ""), " ",
      f.job_id ? ["job ", jobLink(f.job_id)] : "",
      f.task_id ? [" task ", h("span", { class: "mono" }, f.task_id)] : "",
      f.handler ? [" handler ", h("span", { class: "mono" }, shortId(f.handler))] : "",
      f.age_ms ? h("span", { class: "muted" }, ` (${formatDuration(f.age_ms)} old)`) : "",
      f.instance ? h("span", { class: "muted" }, ` on ${f.instance}`) : "",
      f.detail ? h("div", { class: "detail" }, f.detail) : "");
  }

  // ----------------------------------------------------------------- audit

  /** The audit trail, newest first: who changed what, signed in or out, or was refused. */
  function renderAudit(scope, _params, query) {
    const { head, notice, updated } = pageHead("Audit");
    const who = h("input", { id: "audit-who", name: "who", type: "search", value: query.get("who") || "", placeholder: "credential" });
    const form = h("form", { class: "filters", role: "search", "aria-label": "Filter the audit trail" },
      h("label", {}, "Who ", who), h("button", { type: "submit" }, "Filter"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      navigate(who.value ? `/audit?who=${encodeURIComponent(who.value)}` : "/audit");
    });
    const body = h("tbody");
    const table = h("div", { class: "table-wrap" }, h("table", { id: "audit" },
      headRow(["When", "Who", "Role", "From", "Action", "Target", "Arguments", "Outcome"]), body));
    append(pageEl, head, notice,
      h("p", { class: "muted" }, "Every change, sign-in, sign-out and refused credential, as recorded with it. No one can alter a record; retention removes the oldest."),
      form, table);
    keepLoading(scope, 5000, async () => {
      const filter = who.value ? `&who=${encodeURIComponent(who.value)}` : "";
      const data = await scope.api("GET", `/api/audit?limit=500${filter}`);
      const rows = (data.records || []).slice().reverse().map(auditRow);
      replaceKeepingFocus(body, rows.length ? rows : [emptyRow(8, "Nothing is recorded yet.")]);
      touch(updated);
    }, notice);
  }

  function auditRow(r) {
    const args = Object.entries(r.args || {}).sort(([a], [b]) => a.localeCompare(b));
    return h("tr", { "data-key": r.id, "data-action": r.action },
      h("td", {}, timeEl(r.at_ms)),
      h("th", { scope: "row" }, r.who),
      h("td", {}, r.role || "—"),
      h("td", { class: "mono" }, r.from || "—"),
      h("td", { class: "mono" }, r.action),
      h("td", { class: "mono small-text" }, r.target || "—"),
      h("td", { class: "small-text" }, args.length ? args.map(([k, v]) => h("div", {}, `${k}=${v}`)) : "—"),
      h("td", { class: r.outcome === "ok" ? "ok-text" : "error-text" }, r.outcome));
  }

  // -------------------------------------------------------------- capacity

  /** Bytes per second as MB/s. */
  function rate(bytes) {
    const mb = (bytes || 0) / 1e6;
    return `${Number.isInteger(mb) ? mb : mb.toFixed(2)} MB/s`;
  }

  /** The bandwidth budget with each running task's share, and the SeaweedFS cluster's disks, live. */
  function renderCapacity(scope) {
    const { head, notice, updated } = pageHead("Capacity");
    const budget = h("section", { id: "budget", "aria-labelledby": "budget-title" });
    const disks = h("section", { id: "disks", "aria-labelledby": "disks-title" });
    append(pageEl, head, notice, budget, disks);
    keepLoading(scope, 2000, async () => {
      renderIfChanged(budget, await scope.api("GET", "/api/budget"), budgetView);
      let capacity;
      try {
        capacity = await scope.api("GET", "/api/capacity");
      } catch (error) {
        if (error.status === 401 || !scope.alive) throw error;
        capacity = { unavailable: error.message };
      }
      renderIfChanged(disks, capacity, diskView);
      touch(updated);
    }, notice);
  }

  function budgetView(b) {
    const title = h("h2", { id: "budget-title" }, "Bandwidth budget");
    const types = (b.job_types || []).join(", ");
    if (!b.set) {
      return [title, h("p", { id: "budget-line" },
        `None: the tasks that move data (${types}) run at their workers' own rates. `,
        h("span", { class: "muted" }, "Set one with jobcenter budget set --cluster RATE."))];
    }
    const perServer = b.per_server_bytes_per_second ? `, ${rate(b.per_server_bytes_per_second)} through each volume server` : "";
    const line = h("p", { id: "budget-line" },
      `${rate(b.cluster_bytes_per_second)} over the cluster${perServer}; each task starts with at least ${rate(b.minimum_bytes_per_second)}. Shared by ${types}.`);
    const used = h("p", { id: "budget-used" },
      h("meter", { min: "0", max: String(Math.max(b.cluster_bytes_per_second, 1)), value: String(b.used_bytes_per_second || 0), "aria-hidden": "true" }),
      ` ${rate(b.used_bytes_per_second)} used, ${rate(b.free_bytes_per_second)} free`);
    const shares = (b.shares || []).map((s) => {
      const job = s.attempt.split(".")[0];
      return h("tr", { "data-key": s.attempt },
        h("th", { scope: "row" }, jobLink(job), h("span", { class: "mono small-text" }, s.attempt.slice(job.length))),
        h("td", {}, typeLink(s.job_type)),
        h("td", { class: "num" }, rate(s.bytes_per_second)),
        h("td", { class: "mono small-text" }, (s.servers || []).join(", ") || "—"));
    });
    const table = tableEl({ id: "budget-shares" }, ["Attempt", "Job type", num("Share"), "Volume servers"],
      shares.length ? shares : [emptyRow(4, "No budgeted task runs now.")]);
    const parts = [title, line, used, table];
    if (b.per_server_bytes_per_second && (b.servers || []).length) {
      parts.push(tableEl({ id: "budget-servers" }, ["Volume server", num("Used"), num("Free")],
        b.servers.map((s) => h("tr", { "data-key": s.server },
          h("th", { scope: "row", class: "mono" }, s.server),
          h("td", { class: "num" }, rate(s.used_bytes_per_second)),
          h("td", { class: "num" }, rate(Math.max(b.per_server_bytes_per_second - s.used_bytes_per_second, 0)))))));
    }
    return parts;
  }

  function diskView(c) {
    const title = h("h2", { id: "disks-title" }, "Disks");
    if (c.unavailable) return [title, h("p", { class: "muted", id: "disks-unavailable" }, c.unavailable)];
    const rows = (c.disks || []).map((d) => h("tr", { "data-key": `${d.server}/${d.disk_id}` },
      h("th", { scope: "row", class: "mono" }, d.server),
      h("td", {}, `${d.disk_type || "hdd"} ${d.disk_id}`),
      h("td", { class: "num" }, `${d.volumes} / ${d.max_volumes}`),
      h("td", { class: "num" }, String(d.ec_shards)),
      h("td", { class: "num" }, String(d.free_slots)),
      h("td", { class: "num" }, `${d.pending_volumes >= 0 ? "+" : ""}${d.pending_volumes} vol ${d.pending_shards >= 0 ? "+" : ""}${d.pending_shards} shards`),
      h("td", { class: "num" }, String(d.free_slots_after))));
    return [title, c.error ? h("p", { class: "notice" }, `The master could not be asked; last known figures: ${c.error}`) : "",
      tableEl({ id: "disks-table" }, ["Server", "Disk", num("Volumes"), num("EC shards"), num("Free slots"), num("Pending"), num("Free after")],
        rows.length ? rows : [emptyRow(7, "The master lists no disk.")])];
  }

  // ------------------------------------------------------------- schedules

  /** Every schedule: its calendar, its next run and its last, with buttons to pause, resume and run now. */
  function renderSchedules(scope) {
    const { head, notice, updated } = pageHead("Schedules");
    const body = h("tbody");
    const table = h("div", { class: "table-wrap" }, h("table", { id: "schedules" },
      headRow(["Schedule", "Calendar", "Overlap", "Catch-up", "Next run", "Last run", "State", ""]), body));
    append(pageEl, head, notice,
      h("p", { class: "muted" }, "Each schedule runs its job file on its calendar; each run is a job whose origin names the schedule. `jobcenter schedule add` adds one."),
      table);
    const load = async () => {
      const data = await scope.api("GET", "/api/schedules");
      const rows = (data.schedules || []).map((s) => scheduleRow(scope, s, load));
      replaceKeepingFocus(body, rows.length ? rows : [emptyRow(8, "No schedule yet.")]);
      touch(updated);
    };
    keepLoading(scope, 3000, load, notice);
  }

  function scheduleRow(scope, s, reload) {
    const calendar = s.time_zone ? `${s.calendar} (${s.time_zone})` : s.calendar;
    const last = s.last_outcome
      ? [h("span", { class: "tag" }, s.last_outcome.replace("_", " ")), " ", s.last_slot_ms ? timeEl(s.last_slot_ms) : "",
        s.last_job_id ? [" ", jobLink(s.last_job_id)] : ""]
      : h("span", { class: "muted" }, "none yet");
    const pause = h("button", { type: "button", class: "small writes", "data-action": s.paused ? "resume" : "pause" }, s.paused ? "Resume" : "Pause");
    const now = h("button", { type: "button", class: "small writes", "data-action": "run-now" }, "Run now");
    const act = async (button, verb) => {
      button.disabled = true;
      try {
        const answer = await scope.api("POST", `/api/schedules/${encodeURIComponent(s.name)}/${verb}`);
        if (answer && answer.job_id) button.after(h("span", { class: "muted", role: "status" }, " started ", jobLink(answer.job_id)));
        await reload();
      } catch (e) {
        button.after(h("span", { class: "error-text", role: "alert" }, ` ${e.message}`));
      } finally {
        button.disabled = false;
      }
    };
    pause.addEventListener("click", () => act(pause, s.paused ? "resume" : "pause"));
    now.addEventListener("click", async () => {
      if (await confirmAction(`Start a run of ${s.name} now, whatever its calendar says?`, "Run now")) act(now, "run-now");
    });
    return h("tr", { "data-key": s.name, "data-schedule": s.name },
      h("th", { scope: "row" }, s.name, s.job_name ? h("div", { class: "muted" }, s.job_name) : ""),
      h("td", { class: "mono" }, calendar, s.jitter ? h("div", { class: "muted" }, `jitter ${s.jitter}`) : ""),
      h("td", {}, s.overlap.replace("_", " ")),
      h("td", {}, s.catch_up === "last" ? `last, within ${s.catch_up_window || "1h"}` : "none"),
      h("td", { class: "next-run" }, s.paused || !s.next_run_ms ? h("span", { class: "muted" }, "—") : timeEl(s.next_run_ms)),
      h("td", {}, last),
      h("td", { class: "state" }, s.paused ? "paused" : "active"),
      h("td", {}, pause, " ", now));
  }

  // ----------------------------------------------------------------- start

  async function start() {
    document.getElementById("sign-out").addEventListener("click", signOut);
    window.addEventListener("hashchange", () => route(true));
    try {
      const state = await api("GET", "/api/session");
      session.csrf = state.csrf || "";
      session.tokenRequired = Boolean(state.token_required);
      session.name = state.name || "";
      session.role = state.role || "";
      if (state.token_required && !state.authenticated) {
        showLogin();
        return;
      }
    } catch (e) {
      if (e.status === 401) return;
      preparePage("error", "Unavailable");
      append(pageEl, errorBox(new Error(`The admin server does not answer: ${e.message}`)));
      return;
    }
    signedIn();
    route(false);
  }

  window.JobCenter = { api, confirm: confirmAction, navigate, formatTime, formatDuration, formatAge, stateLabel };
  start();
})();
