// jobcenter web console: the job page (header, live task graph in SVG folded for large jobs, task panel), as window.JobPage.
"use strict";

(() => {
  // ------------------------------------------------------------ constants

  const SVG_NS = "http://www.w3.org/2000/svg";

  /** Task and job states with their symbols; the words are always shown beside them. */
  const SYMBOLS = {
    pending: "◷",
    ready: "◷",
    assigned: "▷",
    running: "▶",
    succeeded: "✓",
    failed: "✗",
    upstream_failed: "⊘",
    canceled: "■",
  };

  /** States by index (the typed arrays hold indexes); unknown states are added on sight. */
  const STATE_NAMES = Object.keys(SYMBOLS);
  const STATE_INDEX = new Map(STATE_NAMES.map((name, i) => [name, i]));
  const KNOWN_STATES = STATE_NAMES.length;
  const MAX_STATES = 32;
  const FAILED = STATE_INDEX.get("failed");
  const UPSTREAM_FAILED = STATE_INDEX.get("upstream_failed");
  const RUNNING = STATE_INDEX.get("running");
  const DONE_STATES = ["succeeded", "failed", "upstream_failed", "canceled"];
  const COUNT_ORDER = ["succeeded", "running", "assigned", "ready", "pending", "failed", "upstream_failed", "canceled"];
  const JOB_ENDED = new Set(["succeeded", "failed", "canceled"]);

  /** When to fold: jobs above `jobTasks` fold levels above `levelTasks`; bands when rows exceed `maxRows`. */
  const FOLD = { jobTasks: 200, levelTasks: 24, shown: 500, maxRows: 150, bandRows: 100 };

  /** Geometry of the drawing, in pixels. */
  const SIZE = {
    node: [168, 44],
    group: [270, 62],
    band: [270, 62],
    more: [200, 44],
    fold: [136, 28],
    bandfold: [190, 28],
  };
  const GAP_X = 14;
  const LINE_GAP = 14;
  const ROW_GAP = 60;
  const MARGIN = 20;
  const GUTTER = 64;
  const PER_LINE = 12;
  const CENTRE_WIDTH = 1100;
  const ID_CHARS = 21;

  /** Edge marks, as bits. */
  const E_REACH = 1;
  const E_ANCESTOR = 2;
  const E_DESCENDANT = 4;

  /** Task marks for the selection. */
  const M_ANCESTOR = 1;
  const M_DESCENDANT = 2;
  const M_SELECTED = 3;

  function stateIndex(name) {
    let i = STATE_INDEX.get(name);
    if (i === undefined) {
      if (STATE_NAMES.length >= MAX_STATES) return MAX_STATES - 1;
      i = STATE_NAMES.length;
      STATE_NAMES.push(String(name));
      STATE_INDEX.set(name, i);
    }
    return i;
  }

  function symbolOf(state) {
    return SYMBOLS[state] || "•";
  }

  /** One number formatter for all (making one per call is slow). */
  const NUMBER = new Intl.NumberFormat("en-US");

  function num(n) {
    return NUMBER.format(n);
  }

  function plural(n, word) {
    return `${num(n)} ${word}${n === 1 ? "" : "s"}`;
  }

  /** A long task id cut in the middle, keeping both ends. */
  function shortTaskId(id) {
    if (id.length <= ID_CHARS) return id;
    const head = Math.ceil((ID_CHARS - 1) / 2) - 1;
    return `${id.slice(0, head)}…${id.slice(id.length - (ID_CHARS - 1 - head))}`;
  }

  // ------------------------------------------------------------ DOM helpers

  /** An HTML element; children are nodes or text (always inserted as text). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  /** An SVG element, appended to `parent` when given. */
  function s(tag, attrs, parent) {
    const el = document.createElementNS(SVG_NS, tag);
    setAttrs(el, attrs);
    if (parent) parent.appendChild(el);
    return el;
  }

  function setAttrs(el, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }

  // ------------------------------------------------------------ the model

  /**
   * The graph's arrays as typed arrays: type, level and state by task index,
   * parents and children in compressed rows, and the tasks sorted by level.
   */
  function buildModel(graph) {
    const t = graph.tasks || {};
    const ids = t.id || [];
    const n = ids.length;
    const type = new Uint16Array(n);
    const level = new Int32Array(n);
    const state = new Uint8Array(n);
    const parentStart = new Int32Array(n + 1);
    let levelCount = graph.levels || 0;
    for (let i = 0; i < n; i++) {
      type[i] = t.type ? t.type[i] : 0;
      level[i] = t.level ? t.level[i] : 0;
      state[i] = stateIndex(t.state ? t.state[i] : "pending");
      parentStart[i + 1] = parentStart[i] + (t.deps && t.deps[i] ? t.deps[i].length : 0);
      if (level[i] >= levelCount) levelCount = level[i] + 1;
    }
    const parents = new Int32Array(parentStart[n]);
    const childCount = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      const deps = t.deps && t.deps[i];
      if (!deps) continue;
      for (let k = 0; k < deps.length; k++) {
        parents[parentStart[i] + k] = deps[k];
        childCount[deps[k]]++;
      }
    }
    const [childStart, children] = invert(n, parentStart, parents, childCount);
    const [levelStart, byLevel] = sortByLevel(n, level, levelCount);
    return {
      n, ids, types: graph.types || [], type, level, state, parentStart, parents,
      childStart, children, levelCount, levelStart, byLevel, progress: new Float32Array(n),
    };
  }

  /** Children in compressed rows, from the parents. */
  function invert(n, parentStart, parents, childCount) {
    const childStart = new Int32Array(n + 1);
    for (let i = 0; i < n; i++) childStart[i + 1] = childStart[i] + childCount[i];
    const fill = childStart.slice(0, n);
    const children = new Int32Array(parents.length);
    for (let c = 0; c < n; c++) {
      for (let j = parentStart[c]; j < parentStart[c + 1]; j++) children[fill[parents[j]]++] = c;
    }
    return [childStart, children];
  }

  /** Task indexes grouped by level (in index order within a level). */
  function sortByLevel(n, level, levelCount) {
    const levelStart = new Int32Array(levelCount + 1);
    for (let i = 0; i < n; i++) levelStart[level[i] + 1]++;
    for (let l = 0; l < levelCount; l++) levelStart[l + 1] += levelStart[l];
    const fill = levelStart.slice(0, levelCount);
    const byLevel = new Int32Array(n);
    for (let i = 0; i < n; i++) byLevel[fill[level[i]]++] = i;
    return [levelStart, byLevel];
  }

  /** Counts of `tasks` by state index. */
  function countStates(model, tasks) {
    const counts = new Int32Array(MAX_STATES);
    for (let k = 0; k < tasks.length; k++) counts[model.state[tasks[k]]]++;
    return counts;
  }

  function countOf(counts, name) {
    const i = STATE_INDEX.get(name);
    return i === undefined ? 0 : counts[i];
  }

  /** The ancestors and descendants of `task`, marked in a fresh array. */
  function selectionMarks(model, task) {
    const marks = new Uint8Array(model.n);
    if (task < 0) return marks;
    marks[task] = M_SELECTED;
    walk(model.parentStart, model.parents, task, marks, M_ANCESTOR);
    walk(model.childStart, model.children, task, marks, M_DESCENDANT);
    return marks;
  }

  /** Marks every task reachable from `from` through `start`/`links` with `mark`. */
  function walk(start, links, from, marks, mark) {
    const queue = [from];
    while (queue.length) {
      const i = queue.pop();
      for (let j = start[i]; j < start[i + 1]; j++) {
        const next = links[j];
        if (marks[next]) continue;
        marks[next] = mark;
        queue.push(next);
      }
    }
  }

  // ------------------------------------------------------------ folding

  /**
   * How the job folds. A large job (more than FOLD.jobTasks tasks) draws a
   * level of more than FOLD.levelTasks tasks as clusters (one per job type
   * when the level mixes types), folded until opened; when it has more than
   * FOLD.maxRows levels, runs of levels are banded (bands nest when needed).
   */
  function buildFolds(model) {
    const big = model.n > FOLD.jobTasks;
    const levels = [];
    for (let l = 0; l < model.levelCount; l++) {
      const from = model.levelStart[l];
      const to = model.levelStart[l + 1];
      const folded = big && to - from > FOLD.levelTasks;
      levels.push({ level: l, folded, clusters: folded ? clustersOf(model, l, from, to) : [] });
    }
    const last = model.levelCount - 1;
    const top = big && model.levelCount > FOLD.maxRows ? bandEntries(0, last) : levelEntries(0, last);
    return { levels, top };
  }

  /** The folded groups of one level: the whole level, or one per job type when it mixes types. */
  function clustersOf(model, l, from, to) {
    const byType = new Map();
    for (let k = from; k < to; k++) {
      const i = model.byLevel[k];
      if (!byType.has(model.type[i])) byType.set(model.type[i], []);
      byType.get(model.type[i]).push(i);
    }
    const cluster = (key, type, tasks) => ({ key, level: l, type, tasks, open: false, shown: FOLD.shown });
    if (byType.size <= 1) return [cluster(`L${l}`, -1, model.byLevel.subarray(from, to))];
    const byTypeOrder = [...byType].sort((a, b) => a[0] - b[0]);
    return byTypeOrder.map(([type, list]) => cluster(`L${l}:${type}`, type, Int32Array.from(list)));
  }

  function levelEntries(from, to) {
    const entries = [];
    for (let l = from; l <= to; l++) entries.push({ level: l });
    return entries;
  }

  /** About FOLD.bandRows entries covering levels from..to: bands of several levels. */
  function bandEntries(from, to) {
    const size = Math.ceil((to - from + 1) / FOLD.bandRows);
    const entries = [];
    for (let first = from; first <= to; first += size) {
      const last = Math.min(to, first + size - 1);
      if (first === last) entries.push({ level: first });
      else entries.push({ band: { key: `B${first}-${last}`, from: first, to: last, open: false, entries: null } });
    }
    return entries;
  }

  /** What an opened band shows: its levels, or smaller bands when it spans too many. */
  function bandChildren(band) {
    if (!band.entries) {
      const many = band.to - band.from + 1 > FOLD.maxRows;
      band.entries = many ? bandEntries(band.from, band.to) : levelEntries(band.from, band.to);
    }
    return band.entries;
  }

  // ------------------------------------------------------------ what to draw

  /**
   * The rows drawn now, top to bottom, each with its items: `node` (a task),
   * `group` (a folded cluster), `fold` (folds a cluster back), `more` (the
   * rest of a cluster beyond what is shown), `band` (folded levels) and
   * `bandfold` (folds a band back).
   */
  function visibleRows(folds) {
    const rows = [];
    const visit = (entries) => {
      for (const entry of entries) {
        const band = entry.band;
        if (!band) rows.push(levelRow(folds.levels[entry.level]));
        else if (!band.open) rows.push({ label: `L${band.from}–${band.to}`, items: [item("band", { band })] });
        else {
          rows.push({ label: "", items: [item("bandfold", { band })] });
          visit(bandChildren(band));
        }
      }
    };
    visit(folds.top);
    return rows;
  }

  /** A level's row: an unfolded level gets its nodes in assignItems; a folded one its clusters' items. */
  function levelRow(info) {
    const items = [];
    if (!info.folded) return { label: `L${info.level}`, level: info.level, items, allNodes: true };
    for (const cluster of info.clusters) {
      if (!cluster.open) {
        items.push(item("group", { cluster }));
        continue;
      }
      items.push(item("fold", { cluster }));
      const shown = Math.min(cluster.shown, cluster.tasks.length);
      for (let k = 0; k < shown; k++) items.push(item("node", { task: cluster.tasks[k] }));
      if (shown < cluster.tasks.length) items.push(item("more", { cluster }));
    }
    return { label: `L${info.level}`, level: info.level, items };
  }

  function item(kind, fields) {
    const [w, h] = SIZE[kind];
    return { kind, w, h, x: 0, y: 0, row: -1, index: -1, el: null, counts: null, ...fields };
  }

  /** The key that finds an item again after a redraw (to keep the focus). */
  function itemKey(it) {
    switch (it.kind) {
      case "node": return `n${it.task}`;
      case "group": return it.cluster.key;
      case "fold": return `f${it.cluster.key}`;
      case "more": return `m${it.cluster.key}`;
      case "band": return it.band.key;
      default: return `f${it.band.key}`;
    }
  }

  /** The tasks an item stands for. */
  function tasksOf(model, it) {
    switch (it.kind) {
      case "node": return [it.task];
      case "group": return it.cluster.tasks;
      case "more": return it.cluster.tasks.subarray(Math.min(it.cluster.shown, it.cluster.tasks.length));
      case "band": return model.byLevel.subarray(model.levelStart[it.band.from], model.levelStart[it.band.to + 1]);
      default: return null;
    }
  }

  /**
   * Fills the unfolded levels' rows with their nodes, numbers every item,
   * and maps each task to the item drawing it (`itemOf`); aggregated items
   * get their counts by state.
   */
  function assignItems(model, rows) {
    const items = [];
    const itemOf = new Int32Array(model.n).fill(-1);
    for (const row of rows) {
      if (row.allNodes) {
        const l = row.level;
        for (let k = model.levelStart[l]; k < model.levelStart[l + 1]; k++) {
          row.items.push(item("node", { task: model.byLevel[k] }));
        }
      }
      for (const it of row.items) {
        it.index = items.length;
        items.push(it);
        const tasks = tasksOf(model, it);
        if (!tasks) continue;
        for (let k = 0; k < tasks.length; k++) itemOf[tasks[k]] = it.index;
        if (it.kind !== "node") it.counts = countStates(model, tasks);
      }
    }
    return { items, itemOf };
  }

  // ------------------------------------------------------------ layout

  /**
   * Places the rows top to bottom; a row's items left to right, wrapped
   * every PER_LINE items. Lines are centred within the widest line, but
   * never wider than CENTRE_WIDTH, so that an unfolded wide level does not
   * push the rest out of sight. Nodes are ordered by the mean position of
   * their parents drawn above, which keeps edges short.
   */
  function layout(model, rows, items, itemOf) {
    const centre = Math.min(CENTRE_WIDTH, widestLine(rows));
    const left = MARGIN + GUTTER;
    let y = MARGIN;
    let right = 0;
    rows.forEach((row, r) => {
      orderNodes(model, row.items, items, itemOf);
      for (let k = 0; k < row.items.length; k += PER_LINE) {
        const line = row.items.slice(k, k + PER_LINE);
        const lineH = Math.max(...line.map((it) => it.h));
        let x = left + Math.max(0, (centre - lineWidth(line)) / 2);
        for (const it of line) {
          it.x = x;
          it.y = y + (lineH - it.h) / 2;
          it.row = r;
          x += it.w + GAP_X;
        }
        if (k === 0) row.labelY = y + lineH / 2;
        right = Math.max(right, x - GAP_X);
        y += lineH + LINE_GAP;
      }
      y += ROW_GAP - LINE_GAP;
    });
    return { width: Math.ceil(right + MARGIN), height: Math.ceil(y - ROW_GAP + LINE_GAP + MARGIN) };
  }

  function lineWidth(line) {
    return line.reduce((sum, it) => sum + it.w, 0) + GAP_X * (line.length - 1);
  }

  function widestLine(rows) {
    let widest = 0;
    for (const row of rows) {
      for (let k = 0; k < row.items.length; k += PER_LINE) {
        widest = Math.max(widest, lineWidth(row.items.slice(k, k + PER_LINE)));
      }
    }
    return widest;
  }

  /** Sorts each run of nodes in a row by the mean centre of its parents already placed. */
  function orderNodes(model, rowItems, items, itemOf) {
    let k = 0;
    while (k < rowItems.length) {
      if (rowItems[k].kind !== "node") {
        k++;
        continue;
      }
      let end = k;
      while (end < rowItems.length && rowItems[end].kind === "node") end++;
      const run = rowItems.slice(k, end);
      for (const it of run) it.sortKey = parentCentre(model, it.task, items, itemOf);
      run.sort((a, b) => a.sortKey - b.sortKey || a.task - b.task);
      rowItems.splice(k, run.length, ...run);
      k = end;
    }
  }

  function parentCentre(model, task, items, itemOf) {
    let sum = 0;
    let count = 0;
    for (let j = model.parentStart[task]; j < model.parentStart[task + 1]; j++) {
      const parent = items[itemOf[model.parents[j]]];
      if (!parent || parent.row < 0) continue;
      sum += parent.x + parent.w / 2;
      count++;
    }
    return count ? sum / count : Number.MAX_VALUE;
  }

  /**
   * The edges between drawn items: one per pair of items, counting the
   * dependencies it stands for; `depEdge` maps each dependency (by its
   * place in `parents`) to its edge.
   */
  function buildEdges(model, items, itemOf) {
    const depEdge = new Int32Array(model.parents.length).fill(-1);
    const edges = [];
    const byPair = new Map();
    const count = items.length;
    for (let c = 0; c < model.n; c++) {
      const to = itemOf[c];
      if (to < 0) continue;
      for (let j = model.parentStart[c]; j < model.parentStart[c + 1]; j++) {
        const from = itemOf[model.parents[j]];
        if (from < 0 || from === to) continue;
        const key = from * count + to;
        let e = byPair.get(key);
        if (e === undefined) {
          e = edges.length;
          byPair.set(key, e);
          edges.push({ from, to, deps: 0, flags: 0, cls: "", el: null });
        }
        edges[e].deps++;
        depEdge[j] = e;
      }
    }
    return { edges, depEdge };
  }

  /**
   * Marks each edge: `reach` when it carries a failure downstream (into an
   * upstream_failed task from a failed or upstream_failed one), `ancestor` /
   * `descendant` when it lies on a path into or out of the selected task.
   */
  function classifyEdges(model, edges, depEdge, marks) {
    for (const edge of edges) edge.flags = 0;
    const { parentStart, parents, state } = model;
    for (let c = 0; c < model.n; c++) {
      if (state[c] !== UPSTREAM_FAILED && !marks[c]) continue;
      for (let j = parentStart[c]; j < parentStart[c + 1]; j++) {
        const e = depEdge[j];
        if (e < 0) continue;
        const p = parents[j];
        let flags = 0;
        if (state[c] === UPSTREAM_FAILED && (state[p] === FAILED || state[p] === UPSTREAM_FAILED)) flags |= E_REACH;
        if (marks[p] === M_ANCESTOR && (marks[c] === M_ANCESTOR || marks[c] === M_SELECTED)) flags |= E_ANCESTOR;
        if ((marks[p] === M_SELECTED || marks[p] === M_DESCENDANT) && marks[c] === M_DESCENDANT) flags |= E_DESCENDANT;
        edges[e].flags |= flags;
      }
    }
  }

  function edgeClass(edge) {
    let cls = edge.deps > 1 ? "edge agg" : "edge";
    if (edge.flags & E_REACH) cls += " reach";
    if (edge.flags & E_ANCESTOR) cls += " ancestor";
    if (edge.flags & E_DESCENDANT) cls += " descendant";
    return cls;
  }

  /**
   * Where each edge leaves its source's bottom and enters its target's top:
   * spread along the border in the order of the other ends, so that edges
   * sharing an item stay apart.
   */
  function anchorEdges(items, edges) {
    const outs = new Map();
    const ins = new Map();
    const add = (map, key, edge) => (map.get(key) || map.set(key, []).get(key)).push(edge);
    for (const edge of edges) {
      add(outs, edge.from, edge);
      add(ins, edge.to, edge);
    }
    const centre = (index) => items[index].x + items[index].w / 2;
    const spread = (map, end, other) => {
      for (const [index, list] of map) {
        const it = items[index];
        list.sort((a, b) => centre(a[other]) - centre(b[other]));
        list.forEach((edge, k) => {
          edge[end] = it.x + it.w * (0.15 + (0.7 * (k + 1)) / (list.length + 1));
        });
      }
    };
    spread(outs, "x1", "to");
    spread(ins, "x2", "from");
  }

  /** A cubic path from the bottom of `a` to the top of `b`, at the edge's anchors. */
  function edgePath(edge, a, b) {
    const x1 = edge.x1;
    const y1 = a.y + a.h;
    const x2 = edge.x2;
    const y2 = b.y;
    const bend = Math.max(20, Math.min(90, (y2 - y1) / 2));
    return `M${x1},${y1} C${x1},${y1 + bend} ${x2},${y2 - bend} ${x2},${y2}`;
  }

  // ------------------------------------------------------------ drawing items

  /** Creates the element of an item (its content is painted by paintItem). */
  function drawItem(view, it) {
    const g = s("g", { transform: `translate(${it.x},${it.y})`, tabindex: 0, role: "button" });
    it.el = g;
    view.elItem.set(g, it);
    if (it.kind === "node") drawNode(view.model, it, g);
    else if (it.kind === "group" || it.kind === "band") drawGroup(view.model, it, g);
    else drawControl(view.model, it, g);
    paintItem(view, it);
    return g;
  }

  function drawNode(model, it, g) {
    const id = model.ids[it.task];
    g.setAttribute("data-task", id);
    it.title = s("title", {}, g);
    s("rect", { width: it.w, height: it.h, rx: 4 }, g);
    s("text", { x: 8, y: 14, class: "task-id" }, g).textContent = shortTaskId(id);
    const st = s("text", { x: 8, y: 31, class: "task-state" }, g);
    it.sym = s("tspan", { class: "sym" }, st);
    it.word = s("tspan", {}, st);
    it.bar = s("line", { x1: 2, x2: 2, y1: it.h - 2, y2: it.h - 2, class: "task-progress" }, g);
    it.bar.style.stroke = "var(--run)";
    it.bar.style.strokeWidth = "3";
  }

  function drawGroup(model, it, g) {
    if (it.kind === "group") {
      const c = it.cluster;
      g.setAttribute("class", "group");
      g.setAttribute("data-level", c.level);
      if (c.type >= 0) g.setAttribute("data-type", model.types[c.type] ?? "");
    } else {
      g.setAttribute("class", "group band");
      g.setAttribute("data-band", `${it.band.from}-${it.band.to}`);
    }
    it.title = s("title", {}, g);
    s("rect", { width: it.w, height: it.h, rx: 4 }, g);
    s("text", { x: 10, y: 14 }, g).textContent = groupTitle(model, it);
    it.countsText = s("text", { x: 10, y: 32 }, g);
    const barW = it.w - 20;
    s("rect", { x: 10, y: 46, width: barW, height: 6, class: "track" }, g);
    it.bars = ["bar-done", "bar-failed", "bar-canceled", "bar-running"].map((cls) => s("rect", { x: 10, y: 46, width: 0, height: 6, class: cls }, g));
    it.bars[2].style.fill = "var(--stop)";
  }

  /** The first line of a group: what it holds. */
  function groupTitle(model, it) {
    const total = tasksOf(model, it).length;
    if (it.kind === "band") return `▸ Levels ${it.band.from}–${it.band.to} · ${plural(total, "task")}`;
    const c = it.cluster;
    const type = c.type >= 0 ? ` · ${model.types[c.type]}` : "";
    return `▸ Level ${c.level}${type} · ${plural(total, "task")}`;
  }

  /** The fold, band fold and "show more" controls. */
  function drawControl(model, it, g) {
    const rect = s("rect", { width: it.w, height: it.h, rx: 4 }, g);
    const text = s("text", { x: 10, y: it.h / 2 }, g);
    if (it.kind === "fold") {
      const c = it.cluster;
      g.setAttribute("class", "fold");
      g.setAttribute("data-level", c.level);
      if (c.type >= 0) g.setAttribute("data-type", model.types[c.type] ?? "");
      text.textContent = c.type >= 0 ? `▴ Fold ${model.types[c.type]}` : `▴ Fold level ${c.level}`;
      g.setAttribute("aria-label", `Fold level ${c.level}${c.type >= 0 ? ` (${model.types[c.type]})` : ""} back into a group`);
    } else if (it.kind === "bandfold") {
      g.setAttribute("class", "fold");
      g.setAttribute("data-band", `${it.band.from}-${it.band.to}`);
      text.textContent = `▴ Fold levels ${it.band.from}–${it.band.to}`;
      g.setAttribute("aria-label", `Fold levels ${it.band.from} to ${it.band.to} back into a group`);
    } else {
      g.setAttribute("class", "more");
      g.setAttribute("data-level", it.cluster.level);
      rect.style.fill = "var(--panel)";
      rect.style.stroke = "var(--line-strong)";
      rect.style.strokeDasharray = "4 3";
      text.style.fill = "var(--accent)";
      text.style.dominantBaseline = "middle";
      it.countsText = text;
    }
  }

  /** Brings an item's look up to date with the states (and the selection, for nodes). */
  function paintItem(view, it) {
    if (it.kind === "node") paintNode(view, it);
    else if (it.kind === "group" || it.kind === "band") paintGroup(view.model, it);
    else if (it.kind === "more") paintMore(view.model, it);
  }

  function paintNode(view, it) {
    const model = view.model;
    const i = it.task;
    const state = STATE_NAMES[model.state[i]];
    const id = model.ids[i];
    const type = model.types[model.type[i]] ?? "";
    let cls = "node";
    if (model.state[i] === FAILED) cls += " failed-root";
    if (model.state[i] === UPSTREAM_FAILED) cls += " reach";
    const mark = view.marks[i];
    if (mark === M_SELECTED) cls += " selected";
    else if (mark === M_ANCESTOR) cls += " ancestor";
    else if (mark === M_DESCENDANT) cls += " descendant";
    const g = it.el;
    if (g.getAttribute("class") !== cls) g.setAttribute("class", cls);
    if (g.getAttribute("data-state") !== state) {
      g.setAttribute("data-state", state);
      it.sym.textContent = symbolOf(state);
      g.setAttribute("aria-label", `Task ${id}, ${type}, ${state}`);
      it.title.textContent = `${id}\n${type} · ${state}`;
    }
    const progress = model.state[i] === RUNNING ? Math.max(0, Math.min(100, model.progress[i])) : 0;
    it.word.textContent = progress > 0 ? ` ${state} ${Math.round(progress)}%` : ` ${state}`;
    it.bar.setAttribute("x2", String(2 + ((it.w - 4) * progress) / 100));
    if (mark === M_SELECTED) g.setAttribute("aria-pressed", "true");
    else g.removeAttribute("aria-pressed");
  }

  function paintGroup(model, it) {
    const counts = it.counts;
    const total = tasksOf(model, it).length;
    it.countsText.textContent = countsLine(counts) || "no tasks";
    const parts = [
      countOf(counts, "succeeded"),
      countOf(counts, "failed") + countOf(counts, "upstream_failed"),
      countOf(counts, "canceled"),
      countOf(counts, "running") + countOf(counts, "assigned"),
    ];
    const barW = it.w - 20;
    let x = 10;
    parts.forEach((n, k) => {
      const w = total ? (barW * n) / total : 0;
      it.bars[k].setAttribute("x", String(x));
      it.bars[k].setAttribute("width", String(w));
      x += w;
    });
    const done = DONE_STATES.reduce((sum, name) => sum + countOf(counts, name), 0);
    const what = groupTitle(model, it).slice(2);
    const label = `${what}: ${countsWords(counts)}; ${done} of ${total} done. Unfold.`;
    it.el.setAttribute("aria-label", label);
    it.title.textContent = `${what}\n${countsWords(counts)}\n${done} of ${total} done · Enter or click to unfold`;
  }

  function paintMore(model, it) {
    const rest = tasksOf(model, it).length;
    const next = Math.min(FOLD.shown, rest);
    it.countsText.textContent = `+${num(rest)} more · show ${next}`;
    it.el.setAttribute("aria-label", `${plural(rest, "more task")} in level ${it.cluster.level}: ${countsWords(it.counts)}. Show ${next} more.`);
  }

  /** "96 ✓ 3 ▶ 1 ✗": the counts by state with their symbols. */
  function countsLine(counts) {
    const parts = [];
    const waiting = countOf(counts, "ready") + countOf(counts, "pending");
    for (const name of COUNT_ORDER) {
      if (name === "pending") continue;
      const n = name === "ready" ? waiting : countOf(counts, name);
      if (n) parts.push(`${num(n)} ${symbolOf(name)}`);
    }
    for (let i = KNOWN_STATES; i < STATE_NAMES.length; i++) {
      if (counts[i]) parts.push(`${counts[i]} ${STATE_NAMES[i]}`);
    }
    return parts.join("  ");
  }

  /** "96 succeeded, 3 running": the counts by state in words. */
  function countsWords(counts) {
    const parts = [];
    STATE_NAMES.forEach((name, i) => {
      if (counts[i]) parts.push(`${counts[i]} ${name}`);
    });
    return parts.join(", ") || "no tasks";
  }

  // ------------------------------------------------------------ the page

  /**
   * One shown job: its data, its drawing and its live updates. Everything
   * it owns (the event stream, listeners) ends in `destroy`; its timers are
   * the page's, stopped when the page is left.
   */
  class JobView {
    constructor(page, jobId, ctx) {
      this.page = page;
      this.jobId = jobId;
      this.ctx = ctx;
      this.alive = true;
      this.path = `/api/jobs/${encodeURIComponent(jobId)}`;
      this.job = null;
      this.model = null;
      this.selected = -1;
      this.marks = new Uint8Array(0);
      this.elItem = new WeakMap();
      this.dirty = new Set();
      this.frame = 0;
      this.source = null;
      this.zoom = 1;
      this.panelRequest = 0;
      this.onDocKey = (e) => this.docKey(e);
      this.buildPage();
    }

    // ---- lifecycle

    /** Reads the graph, draws it and starts the live updates. */
    async start() {
      const started = performance.now();
      const graph = await this.ctx.api("GET", `${this.path}/graph`);
      if (!this.alive) return;
      const received = performance.now();
      this.setGraph(graph);
      this.redraw();
      this.openEvents();
      const drawn = performance.now();
      this.svg.dataset.buildMs = String(Math.round(drawn - received));
      requestAnimationFrame(() => {
        if (this.svg) this.svg.dataset.renderMs = String(Math.round(performance.now() - started));
      });
      if (typeof this.ctx.loaded === "function") this.ctx.loaded();
    }

    destroy() {
      this.alive = false;
      this.closeEvents();
      if (this.frame) cancelAnimationFrame(this.frame);
      document.removeEventListener("keydown", this.onDocKey);
    }

    /** The page's timer (stopped when the page is left), skipped once this view is gone. */
    later(ms, fn) {
      return this.ctx.later(ms, () => this.alive && fn());
    }

    /** Takes a fresh graph: rebuilds the model unless only states changed. */
    setGraph(graph) {
      this.job = graph;
      const sameShape = this.model && this.model.n === (graph.tasks && graph.tasks.id ? graph.tasks.id.length : 0);
      if (sameShape) {
        this.applyStates(graph.tasks.state || []);
        return false;
      }
      this.model = buildModel(graph);
      this.folds = buildFolds(this.model);
      this.counts = countStates(this.model, this.model.byLevel);
      this.selected = -1;
      this.marks = new Uint8Array(this.model.n);
      return true;
    }

    // ---- page skeleton

    /** The header, the graph's box and the task panel, empty until the graph arrives. */
    buildPage() {
      this.nameEl = h("h1", { id: "job-name", tabindex: "-1" }, "Job");
      this.stateEl = h("span", { id: "job-state", "aria-live": "polite" }, "");
      this.cancelNote = h("span", { class: "tag", hidden: true }, "cancel requested");
      this.cancelBtn = h("button", { type: "button", id: "cancel-job", class: "danger writes", hidden: true, onclick: () => this.act("cancel") }, "Cancel job");
      this.retryBtn = h("button", { type: "button", id: "retry-job", class: "writes", hidden: true, onclick: () => this.act("retry") }, "Retry job");
      this.liveEl = h("span", { class: "muted small-text", id: "job-live", role: "status" }, "");
      this.factsEl = h("dl", { class: "figures", id: "job-facts" });
      this.countsEl = h("p", { id: "job-counts", "aria-label": "Tasks by state" });
      this.errorEl = h("div", { class: "error-box", id: "job-error", role: "alert", hidden: true });
      const crumbs = h("p", { class: "crumbs" }, h("a", { href: "#/jobs" }, "Jobs"), " / ", h("span", { class: "mono" }, this.jobId));
      const head = h("header", { class: "page-head job-head" },
        this.nameEl, this.stateEl, this.cancelNote,
        h("span", { class: "actions" }, this.cancelBtn, this.retryBtn), this.liveEl);
      this.svg = s("svg", { id: "dag", role: "group", "aria-label": "Task graph", width: 0, height: 0 });
      this.wrap = h("div", { class: "graph-wrap dag-wrap", id: "dag-wrap" }, this.svg);
      this.hintEl = h("p", { class: "muted small-text", id: "dag-hint", hidden: true });
      this.panel = this.buildPanel();
      this.layoutEl = h("section", { class: "job-layout", "aria-label": "Tasks" },
        h("div", { class: "graph-col" }, this.toolbar(), this.wrap), this.panel);
      this.page.append(crumbs, head, this.factsEl, this.countsEl, this.errorEl, this.hintEl, this.layoutEl);
      this.addSymbolIfNeeded();
      this.showPanel(false);
      this.bindGraphEvents();
      document.addEventListener("keydown", this.onDocKey);
    }

    /**
     * `#job-state` holds the state word alone; its symbol comes from the
     * stylesheet when it draws one, else from an element of its own.
     */
    addSymbolIfNeeded() {
      this.stateEl.dataset.state = "pending";
      const before = getComputedStyle(this.stateEl, "::before").content;
      delete this.stateEl.dataset.state;
      if (before && before !== "none" && before !== "normal") return;
      this.stateSym = h("span", { id: "job-state-symbol", "aria-hidden": "true" }, "");
      this.stateEl.before(this.stateSym);
    }

    toolbar() {
      const zoomBtn = (id, label, title, factor) =>
        h("button", { type: "button", id, class: "small", title, "aria-label": title, onclick: () => this.setZoom(factor) }, label);
      this.zoomLabel = zoomBtn("zoom-reset", "100%", "Actual size", 0);
      return h("div", { class: "actions dag-tools" },
        zoomBtn("zoom-out", "−", "Zoom out", 1 / 1.25), this.zoomLabel, zoomBtn("zoom-in", "+", "Zoom in", 1.25),
        h("span", { class: "muted small-text" }, "Drag the background to pan; Tab or arrow keys move between tasks; Enter selects or unfolds."));
    }

    /** Scales the drawing (factor 0 resets to 100%). */
    setZoom(factor) {
      this.zoom = factor ? Math.max(0.2, Math.min(2.5, this.zoom * factor)) : 1;
      this.zoomLabel.textContent = `${Math.round(this.zoom * 100)}%`;
      this.sizeSvg();
    }

    sizeSvg() {
      if (!this.size) return;
      this.svg.setAttribute("width", String(Math.round(this.size.width * this.zoom)));
      this.svg.setAttribute("height", String(Math.round(this.size.height * this.zoom)));
    }

    // ---- header

    /** Name, state, facts, counts and which actions make sense now. */
    paintHeader() {
      const job = this.job;
      const c = this.ctx;
      this.nameEl.textContent = job.name || job.id || this.jobId;
      this.nameEl.title = job.id || this.jobId;
      this.stateEl.textContent = job.state;
      this.stateEl.dataset.state = job.state;
      if (this.stateSym) {
        this.stateSym.textContent = `${symbolOf(job.state)} `;
        this.stateSym.dataset.state = job.state;
      }
      document.title = `${job.name || "Job"} · jobcenter`;
      const ended = JOB_ENDED.has(job.state);
      const canCancel = (job.state === "pending" || job.state === "running") && !job.cancel_requested;
      this.cancelBtn.hidden = !(job.state === "pending" || job.state === "running");
      this.cancelBtn.disabled = !canCancel || this.busy;
      this.retryBtn.hidden = !(job.state === "failed" || job.state === "canceled");
      this.retryBtn.disabled = this.busy;
      this.cancelNote.hidden = !(job.cancel_requested && !ended);
      this.paintFacts(c);
      this.paintCounts();
    }

    paintFacts(c) {
      const job = this.job;
      const fmt = (ms) => (c.formatTime ? c.formatTime(ms) : ms ? new Date(ms).toISOString() : "—");
      const took = job.finished_at_ms && job.created_at_ms ? job.finished_at_ms - job.created_at_ms : null;
      const facts = [
        ["Origin", originNode(job.origin), "origin"],
        ["Priority", job.priority || "mixed", "priority"],
        ["Created", fmt(job.created_at_ms), "created"],
        ["Finished", fmt(job.finished_at_ms), "finished"],
        ["Took", took === null ? "—" : c.formatDuration ? c.formatDuration(took) : `${took} ms`, "took"],
        ["Tasks", num(this.model.n), "tasks"],
        ["Levels", num(this.model.levelCount), "levels"],
      ];
      this.factsEl.replaceChildren(...facts.map(([dt, dd, key]) =>
        h("div", {}, h("dt", {}, dt), h("dd", { "data-fact": key }, dd))));
    }

    paintCounts() {
      const parts = [];
      STATE_NAMES.forEach((name, i) => {
        const n = this.counts[i];
        if (!n) return;
        if (parts.length) parts.push(" · ");
        parts.push(h("span", { class: "state", "data-state": name, "data-count": n }, `${num(n)} ${name}`));
      });
      this.countsEl.replaceChildren(...parts);
    }

    showError(message) {
      this.errorEl.textContent = message || "";
      this.errorEl.hidden = !message;
    }

    /** Cancel or retry, after the operator confirms. */
    async act(kind) {
      const name = this.job ? this.job.name || this.jobId : this.jobId;
      const question = kind === "cancel"
        ? `Cancel the job “${name}”? Its unfinished tasks will not run.`
        : `Retry the job “${name}”? Its tasks that did not succeed run again.`;
      const yes = await this.ctx.confirm(question, kind === "cancel" ? "Cancel job" : "Retry job");
      if (!yes || !this.alive) return;
      this.busy = true;
      this.paintHeader();
      this.showError("");
      try {
        await this.ctx.api("POST", `${this.path}/${kind}`);
        if (!this.alive) return;
        await this.resync();
      } catch (error) {
        if (this.alive) this.showError(`Could not ${kind} the job: ${error.message || error}`);
      } finally {
        this.busy = false;
        if (this.alive && this.job) this.paintHeader();
      }
    }

    // ---- the drawing

    /** Draws what is unfolded now from scratch; `focusKey` names the item to focus afterwards. */
    redraw(focusKey) {
      const model = this.model;
      const rows = visibleRows(this.folds);
      const { items, itemOf } = assignItems(model, rows);
      this.size = layout(model, rows, items, itemOf);
      const { edges, depEdge } = buildEdges(model, items, itemOf);
      Object.assign(this, { rows, items, itemOf, edges, depEdge, byKey: new Map() });
      classifyEdges(model, edges, depEdge, this.marks);
      this.dirty.clear();

      anchorEdges(items, edges);
      const edgeLayer = s("g", { class: "edges", "aria-hidden": "true" });
      for (const edge of edges) this.drawEdge(edge, edgeLayer);
      const labelLayer = s("g", { class: "level-labels", "aria-hidden": "true" });
      const itemLayer = s("g", { class: "items" });
      for (const row of rows) {
        if (row.label) this.drawLabel(row, labelLayer);
        for (const it of row.items) {
          itemLayer.appendChild(drawItem(this, it));
          this.byKey.set(itemKey(it), it);
        }
      }
      this.svg.replaceChildren(labelLayer, edgeLayer, itemLayer);
      this.svg.setAttribute("viewBox", `0 0 ${this.size.width} ${this.size.height}`);
      this.sizeSvg();
      this.paintHeader();
      this.paintHint();
      if (focusKey) this.focusItem(focusKey);
    }

    drawEdge(edge, layer) {
      const path = s("path", { d: edgePath(edge, this.items[edge.from], this.items[edge.to]) }, layer);
      edge.el = path;
      edge.cls = edgeClass(edge);
      path.setAttribute("class", edge.cls);
      if (edge.deps > 1) s("title", {}, path).textContent = `${num(edge.deps)} dependencies`;
    }

    drawLabel(row, layer) {
      const text = s("text", { x: MARGIN, y: row.labelY, class: "level-label" }, layer);
      text.textContent = row.label;
      text.style.fill = "var(--muted)";
      text.style.fontSize = "11px";
      text.style.dominantBaseline = "middle";
    }

    paintHint() {
      const folded = this.items.some((it) => it.kind === "group" || it.kind === "band");
      this.hintEl.hidden = !folded;
      this.hintEl.textContent = folded
        ? `A large job: levels of more than ${FOLD.levelTasks} tasks are folded into groups${this.folds.top.some((e) => e.band) ? ", and runs of levels into bands" : ""}. Click a group (or press Enter on it) to unfold it.`
        : "";
    }

    focusItem(key) {
      const it = this.byKey.get(key);
      if (it && it.el) it.el.focus();
    }

    /** Repaints what live updates touched, once per frame. */
    schedule() {
      if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
    }

    flush() {
      this.frame = 0;
      if (!this.alive || !this.items) return;
      for (const index of this.dirty) paintItem(this, this.items[index]);
      this.dirty.clear();
      if (this.edgesDirty) {
        this.edgesDirty = false;
        classifyEdges(this.model, this.edges, this.depEdge, this.marks);
        this.paintEdges();
      }
      if (this.headerDirty) {
        this.headerDirty = false;
        this.paintHeader();
      }
      if (this.panelDirty) {
        this.panelDirty = false;
        this.paintPanelLive();
      }
    }

    paintEdges() {
      for (const edge of this.edges) {
        const cls = edgeClass(edge);
        if (cls === edge.cls) continue;
        edge.cls = cls;
        edge.el.setAttribute("class", cls);
      }
    }

    /** Repaints every drawn node (after the selection changed). */
    paintNodes() {
      for (const it of this.items) if (it.kind === "node") paintNode(this, it);
    }

    // ---- graph interaction

    bindGraphEvents() {
      this.svg.addEventListener("click", (e) => {
        const g = e.target.closest && e.target.closest("g.node, g.group, g.fold, g.more");
        if (g && !this.dragged) this.activate(this.elItem.get(g));
      });
      this.svg.addEventListener("keydown", (e) => this.graphKey(e));
      this.bindPan();
    }

    /** What Enter or a click does on an item. */
    activate(it) {
      if (!it) return;
      switch (it.kind) {
        case "node":
          this.select(it.task);
          break;
        case "group":
          it.cluster.open = true;
          this.redraw(`f${it.cluster.key}`);
          break;
        case "fold":
          it.cluster.open = false;
          it.cluster.shown = FOLD.shown;
          this.redraw(it.cluster.key);
          break;
        case "more": {
          const first = it.cluster.tasks[it.cluster.shown];
          it.cluster.shown += FOLD.shown;
          this.redraw(`n${first}`);
          break;
        }
        case "band":
          it.band.open = true;
          this.redraw(`f${it.band.key}`);
          break;
        case "bandfold":
          it.band.open = false;
          this.redraw(it.band.key);
          break;
        default:
      }
    }

    graphKey(e) {
      const g = e.target.closest && e.target.closest("g.node, g.group, g.fold, g.more");
      const it = g && this.elItem.get(g);
      if (!it) return;
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        this.activate(it);
        return;
      }
      const next = this.neighbour(it, e.key);
      if (next) {
        e.preventDefault();
        next.el.focus();
      }
    }

    /** The item an arrow key moves to: beside in the row, or the nearest in the row above/below. */
    neighbour(it, key) {
      const row = this.rows[it.row];
      const at = row.items.indexOf(it);
      if (key === "ArrowLeft") return row.items[at - 1];
      if (key === "ArrowRight") return row.items[at + 1];
      const step = key === "ArrowUp" ? -1 : key === "ArrowDown" ? 1 : 0;
      const other = step && this.rows[it.row + step];
      if (!other) return null;
      const cx = it.x + it.w / 2;
      let best = null;
      for (const cand of other.items) {
        const d = Math.abs(cand.x + cand.w / 2 - cx) + (step > 0 ? cand.y : -cand.y) * 0.001;
        if (!best || d < best.d) best = { d, cand };
      }
      return best && best.cand;
    }

    /** Dragging the background scrolls the graph's box. */
    bindPan() {
      let start = null;
      this.svg.addEventListener("pointerdown", (e) => {
        if (e.button !== 0 || e.target.closest("g.node, g.group, g.fold, g.more")) return;
        start = { x: e.clientX, y: e.clientY, left: this.wrap.scrollLeft, top: this.wrap.scrollTop };
        this.dragged = false;
        this.svg.setPointerCapture(e.pointerId);
      });
      this.svg.addEventListener("pointermove", (e) => {
        if (!start) return;
        const dx = e.clientX - start.x;
        const dy = e.clientY - start.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) this.dragged = true;
        this.wrap.scrollLeft = start.left - dx;
        this.wrap.scrollTop = start.top - dy;
        this.svg.style.cursor = "grabbing";
      });
      const end = () => {
        start = null;
        this.svg.style.cursor = "";
        setTimeout(() => { this.dragged = false; }, 0);
      };
      this.svg.addEventListener("pointerup", end);
      this.svg.addEventListener("pointercancel", end);
    }

    docKey(e) {
      if (e.key !== "Escape" || this.panel.hidden || e.defaultPrevented) return;
      if (document.querySelector("dialog[open]")) return;
      this.closePanel();
    }

    // ---- selection

    /** Selects a task: marks its ancestors and descendants and opens its panel. */
    select(task) {
      this.selected = task;
      this.marks = selectionMarks(this.model, task);
      classifyEdges(this.model, this.edges, this.depEdge, this.marks);
      this.paintEdges();
      this.paintNodes();
      this.showPanel(true);
      this.loadTask();
    }

    /** Unfolds whatever hides `task`, draws it and selects it. */
    reveal(task) {
      const level = this.model.level[task];
      let entries = this.folds.top;
      for (;;) {
        const holder = entries.find((e) => e.band && e.band.from <= level && level <= e.band.to);
        if (!holder) break;
        holder.band.open = true;
        entries = bandChildren(holder.band);
      }
      const info = this.folds.levels[level];
      for (const cluster of info.clusters) {
        const at = cluster.tasks.indexOf(task);
        if (at < 0) continue;
        cluster.open = true;
        if (at >= cluster.shown) cluster.shown = Math.ceil((at + 1) / FOLD.shown) * FOLD.shown;
      }
      if (this.itemOf[task] < 0 || this.items[this.itemOf[task]].kind !== "node") this.redraw();
      this.select(task);
      this.focusItem(`n${task}`);
    }

    clearSelection() {
      this.selected = -1;
      this.marks = new Uint8Array(this.model.n);
      classifyEdges(this.model, this.edges, this.depEdge, this.marks);
      this.paintEdges();
      this.paintNodes();
    }

    // ---- the task panel

    buildPanel() {
      this.panelTitle = h("h2", { id: "task-panel-title" }, "Task");
      this.panelError = h("p", { class: "error-text", id: "task-panel-error", role: "alert" });
      this.fields = {};
      const field = (key, label, tag = "dd") => {
        const dd = h(tag, { "data-field": key }, "—");
        this.fields[key] = dd;
        return [h("dt", {}, label), tag === "dd" ? dd : h("dd", {}, dd)];
      };
      this.fields.failures = h("span", { "data-field": "failures" }, "0");
      this.fields.lost = h("span", { "data-field": "lost" }, "0");
      const attemptDd = h("dd", {}, h("span", { "data-field": "attempt" }, "—"), " ",
        h("span", { class: "muted" }, "(failures ", this.fields.failures, ", lost ", this.fields.lost, ")"));
      this.fields.attempt = attemptDd.firstChild;
      this.progressBar = h("progress", { max: "100", value: "0", "aria-label": "Progress" });
      this.fields.progress = h("span", { "data-field": "progress" }, "—");
      const close = h("button", { type: "button", id: "task-panel-close", class: "small quiet", "aria-label": "Close the task panel", onclick: () => this.closePanel() }, "✕ Close");
      return h("aside", { id: "task-panel", "aria-labelledby": "task-panel-title", tabindex: "-1" },
        h("div", { class: "page-head" }, this.panelTitle, close),
        this.panelError,
        h("dl", {},
          field("id", "Id"), field("job_type", "Job type"), field("state", "State"),
          h("dt", {}, "Attempt"), attemptDd,
          field("handler", "Handler"), field("worker_id", "Worker"),
          field("assigned_at", "Assigned"), field("started_at", "Started"), field("finished_at", "Finished"),
          h("dt", {}, "Progress"), h("dd", {}, this.progressBar, " ", this.fields.progress),
          field("priority", "Priority"), field("labels", "Labels"),
          field("depends_on", "Depends on"), field("needed_by", "Needed by")),
        h("h3", {}, "Parameters"), h("pre", { "data-field": "parameters" }),
        h("h3", {}, "Output"), h("pre", { "data-field": "output" }),
        h("h3", {}, "Error"), h("p", { "data-field": "error" }));
    }

    showPanel(open) {
      this.panel.hidden = !open;
      this.layoutEl.style.gridTemplateColumns = open ? "" : "minmax(0, 1fr)";
    }

    closePanel() {
      const task = this.selected;
      this.panelRequest++;
      this.showPanel(false);
      if (this.model) this.clearSelection();
      const it = task >= 0 && this.items && this.items[this.itemOf[task]];
      if (it && it.el) it.el.focus();
    }

    fieldEl(key) {
      return this.fields[key] || this.panel.querySelector(`[data-field="${key}"]`);
    }

    /** Shows what the graph knows at once, then fetches the task. */
    loadTask() {
      const task = this.selected;
      if (task < 0) return;
      const id = this.model.ids[task];
      this.panelTitle.textContent = `Task ${shortTaskId(id)}`;
      this.panelTitle.title = id;
      this.setField("id", id);
      this.setField("job_type", this.model.types[this.model.type[task]] ?? "");
      this.paintPanelLive();
      this.paintLinks(task);
      this.fetchTask();
    }

    async fetchTask() {
      const task = this.selected;
      const request = ++this.panelRequest;
      this.panelLoading = true;
      try {
        const data = await this.ctx.api("GET", `${this.path}/tasks/${encodeURIComponent(this.model.ids[task])}`);
        if (!this.alive || request !== this.panelRequest) return;
        this.panelError.textContent = "";
        this.fillPanel(data);
      } catch (error) {
        if (this.alive && request === this.panelRequest) this.panelError.textContent = `Could not read the task: ${error.message || error}`;
      } finally {
        if (request === this.panelRequest) this.panelLoading = false;
      }
    }

    /** Fetches the selected task again soon (at most twice a second). */
    refreshTaskSoon() {
      if (this.panelTimer) return;
      this.panelTimer = this.later(400, () => {
        this.panelTimer = 0;
        if (!this.panel.hidden && this.selected >= 0) this.fetchTask();
      });
    }

    setField(key, value) {
      const el = this.fieldEl(key);
      if (!el) return;
      const text = value === null || value === undefined || value === "" ? "—" : String(value);
      el.textContent = text;
    }

    /** The state and progress as the live events know them. */
    paintPanelLive() {
      const task = this.selected;
      if (task < 0 || this.panel.hidden) return;
      const state = STATE_NAMES[this.model.state[task]];
      const el = this.fieldEl("state");
      el.textContent = state;
      el.className = "state";
      el.dataset.state = state;
      if (this.model.progress[task]) this.paintProgress(this.model.progress[task], this.stage);
    }

    paintProgress(percent, stage) {
      const p = Math.max(0, Math.min(100, Number(percent) || 0));
      this.progressBar.value = p;
      this.fields.progress.textContent = `${Math.round(p)}%${stage ? ` · ${stage}` : ""}`;
    }

    clearProgress() {
      this.progressBar.value = 0;
      this.fields.progress.textContent = "—";
    }

    /** Every field from the task's record. */
    fillPanel(t) {
      const c = this.ctx;
      const time = (ms) => (c.formatTime ? c.formatTime(ms) : ms ? new Date(ms).toISOString() : "—");
      this.setField("id", t.id);
      this.setField("job_type", t.job_type);
      this.setField("attempt", t.attempt);
      this.setField("failures", t.failures ?? 0);
      this.setField("lost", t.lost ?? 0);
      this.setField("handler", t.handler);
      this.setField("worker_id", t.worker_id);
      this.setField("assigned_at", time(t.assigned_at_ms));
      this.setField("started_at", time(t.started_at_ms));
      this.setField("finished_at", time(t.finished_at_ms));
      this.setField("priority", t.priority);
      this.setField("labels", labelsText(t.labels));
      this.setField("parameters", prettyJson(t.parameters));
      this.setField("output", Array.isArray(t.output) && t.output.length ? t.output.join("\n") : "");
      this.fieldEl("error").textContent = t.error || "";
      this.stage = t.stage || "";
      if (t.progress_percent || t.state === "running") this.paintProgress(t.progress_percent, t.stage);
      else this.clearProgress();
      const state = this.fieldEl("state");
      state.textContent = t.state;
      state.className = "state";
      state.dataset.state = t.state;
    }

    /** Buttons for the parents and children, which select them (unfolding as needed). */
    paintLinks(task) {
      const m = this.model;
      const list = (start, links) => {
        const out = [];
        const total = start[task + 1] - start[task];
        for (let j = start[task]; j < start[task + 1] && out.length < 40; j++) {
          const other = links[j];
          const state = STATE_NAMES[m.state[other]];
          const label = this.ctx.stateLabel ? this.ctx.stateLabel(state) : `${symbolOf(state)} ${state}`;
          out.push(h("button", { type: "button", class: "small quiet", title: label, onclick: () => this.reveal(other) }, m.ids[other]));
        }
        if (total > out.length) out.push(h("span", { class: "muted" }, ` and ${total - out.length} more`));
        return out.length ? out : ["—"];
      };
      this.fieldEl("depends_on").replaceChildren(...list(m.parentStart, m.parents));
      this.fieldEl("needed_by").replaceChildren(...list(m.childStart, m.children));
    }

    // ---- live updates

    /** Opens the job's event stream unless the job has ended. */
    openEvents() {
      if (this.source || !this.alive || JOB_ENDED.has(this.job.state)) {
        this.setLive(JOB_ENDED.has(this.job.state) ? "" : this.liveEl.textContent);
        return;
      }
      if (typeof EventSource !== "function") return;
      const source = new EventSource(`${this.path}/events`);
      this.source = source;
      const on = (name, fn) => source.addEventListener(name, (e) => {
        if (this.source !== source) return;
        let data;
        try {
          data = JSON.parse(e.data);
        } catch (_) {
          return;
        }
        fn.call(this, data);
      });
      on("states", this.onStates);
      on("task", this.onTask);
      on("job", this.onJob);
      source.onopen = () => {
        this.retryDelay = 0;
        this.setLive("● live");
      };
      source.onerror = () => {
        if (this.source !== source) return;
        if (source.readyState === EventSource.CLOSED) {
          // The browser gave up: read the graph again later (waiting longer each time), then reopen.
          this.source = null;
          this.retryDelay = Math.min(60000, (this.retryDelay || 2500) * 2);
          this.setLive("live updates lost; trying again");
          this.later(this.retryDelay, () => this.resync().catch(() => this.later(this.retryDelay, () => this.openEvents())));
        } else {
          this.setLive("reconnecting…");
        }
      };
    }

    closeEvents() {
      if (this.source) this.source.close();
      this.source = null;
    }

    setLive(text) {
      this.liveEl.textContent = text;
    }

    /** Reads the graph again (after an action or a lost stream) and applies it. */
    async resync() {
      const graph = await this.ctx.api("GET", `${this.path}/graph`);
      if (!this.alive) return;
      const selected = this.selected >= 0 ? this.model.ids[this.selected] : null;
      if (this.setGraph(graph)) {
        this.redraw();
        if (selected !== null) this.closePanel();
      } else {
        this.headerDirty = true;
        this.schedule();
      }
      if (JOB_ENDED.has(graph.state)) this.closeEvents();
      else this.openEvents();
      if (selected !== null && !this.panel.hidden) this.refreshTaskSoon();
    }

    /** A full snapshot of the task states. */
    onStates(data) {
      if (Array.isArray(data.states) && data.states.length === this.model.n) this.applyStates(data.states);
      if (data.state) this.setJobState(data.state);
      this.schedule();
    }

    /** Applies a full list of states, touching only what changed. */
    applyStates(states) {
      for (let i = 0; i < states.length && i < this.model.n; i++) this.setTaskState(i, stateIndex(states[i]));
      if (this.selected >= 0) this.refreshTaskSoon();
    }

    /** One task's transition or progress. */
    onTask(data) {
      const i = this.taskIndex(data);
      if (i < 0) return;
      if (typeof data.progress_percent === "number") this.model.progress[i] = data.progress_percent;
      if (data.state) this.setTaskState(i, stateIndex(data.state));
      if (this.itemOf[i] >= 0) this.dirty.add(this.itemOf[i]);
      if (i === this.selected) {
        this.stage = data.stage || this.stage;
        this.panelDirty = true;
        this.refreshTaskSoon();
      }
      this.schedule();
    }

    /** The job's own transition; the stream ends after a final state. */
    onJob(data) {
      if (data.state) this.setJobState(data.state);
      if (JOB_ENDED.has(data.state) && data.at_ms) this.job.finished_at_ms = data.at_ms;
      this.schedule();
    }

    setJobState(state) {
      if (this.job.state !== state) {
        this.job.state = state;
        this.headerDirty = true;
      }
      if (JOB_ENDED.has(state) && this.source) {
        // The stream ends here; one last read settles any transition it did not carry.
        this.closeEvents();
        this.setLive("");
        this.headerDirty = true;
        this.resync().catch(() => {});
      }
    }

    /** The task an event names: by index, checked against its id. */
    taskIndex(data) {
      const ids = this.model.ids;
      if (Number.isInteger(data.idx) && data.idx >= 0 && data.idx < ids.length && (!data.task_id || ids[data.idx] === data.task_id)) return data.idx;
      if (!data.task_id) return -1;
      if (!this.idIndex) this.idIndex = new Map(ids.map((id, i) => [id, i]));
      return this.idIndex.get(data.task_id) ?? -1;
    }

    /** Moves a task to a state: counters, its item's counts, and what to repaint. */
    setTaskState(i, next) {
      const model = this.model;
      const prev = model.state[i];
      if (prev === next) return;
      model.state[i] = next;
      this.counts[prev]--;
      this.counts[next]++;
      this.headerDirty = true;
      const index = this.itemOf ? this.itemOf[i] : -1;
      if (index >= 0) {
        const it = this.items[index];
        if (it.counts) {
          it.counts[prev]--;
          it.counts[next]++;
        }
        this.dirty.add(index);
      }
      const failing = (x) => x === FAILED || x === UPSTREAM_FAILED;
      if (failing(prev) || failing(next)) this.edgesDirty = true;
      if (i === this.selected) this.panelDirty = true;
    }
  }

  /** `user`, `recovery`, or `scheduler:<job type>:<sequence>` with a link to the job type. */
  function originNode(origin) {
    if (!origin) return "—";
    const [kind, type, ...rest] = origin.split(":");
    if (kind !== "scheduler" || !type) return origin;
    return h("span", {}, "scheduler · ", h("a", { href: `#/types/${encodeURIComponent(type)}` }, type), rest.length ? ` #${rest.join(":")}` : "");
  }

  /** A JSON text (or value) indented for reading; the text itself when it is not JSON. */
  function prettyJson(value) {
    if (value === null || value === undefined || value === "") return "";
    if (typeof value !== "string") return JSON.stringify(value, null, 2);
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch (_) {
      return value;
    }
  }

  function labelsText(labels) {
    if (!labels || typeof labels !== "object") return "";
    return Object.entries(labels).map(([k, v]) => `${k}=${v}`).join(", ");
  }

  // ------------------------------------------------------------ the page API

  let current = null;

  window.JobPage = {
    /** Shows job `jobId` in `pageElement`; resolves once the graph is drawn. */
    mount(pageElement, jobId, ctx) {
      window.JobPage.unmount();
      const view = new JobView(pageElement, jobId, ctx || {});
      current = view;
      return view.start();
    },

    /** Stops the live updates and forgets the shown job. */
    unmount() {
      if (current) current.destroy();
      current = null;
    },
  };
})();
