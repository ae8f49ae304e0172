// dag.js -- a request's DAG as SVG: nodes in columns by depth (the longest
// path from a root), edges as arrows, each node coloured by its state
// (classes st-<state> in app.css) and the frontier outlined.  Each node
// group carries data-node-key and data-state, which the browser tests
// compare with the database.
import { svg } from './dom.js';

const W = 170;
const H = 54;
const GAP_X = 60;
const GAP_Y = 22;
const PAD = 12;

function depths(nodes, edges) {
  const depth = new Map(nodes.map((n) => [n.node_key, 0]));
  // longest path by relaxation (a DAG has at most |nodes| levels)
  for (let i = 0; i < nodes.length; i += 1) {
    let changed = false;
    for (const e of edges) {
      const d = (depth.get(e.from) ?? 0) + 1;
      if (depth.has(e.to) && d > depth.get(e.to)) { depth.set(e.to, d); changed = true; }
    }
    if (!changed) break;
  }
  return depth;
}

export function drawDag(req) {
  const nodes = req.nodes || [];
  const edges = req.edges || [];
  const frontier = new Set(req.current_frontier || []);
  const depth = depths(nodes, edges);
  const columns = [];
  for (const n of nodes) {
    const d = depth.get(n.node_key);
    (columns[d] = columns[d] || []).push(n);
  }
  const pos = new Map();
  columns.forEach((col, x) => col.forEach((n, y) => {
    pos.set(n.node_key, { x: PAD + x * (W + GAP_X), y: PAD + y * (H + GAP_Y) });
  }));
  const width = PAD * 2 + Math.max(1, columns.length) * (W + GAP_X) - GAP_X;
  const height = PAD * 2 + Math.max(1, ...columns.map((c) => (c ? c.length : 0))) * (H + GAP_Y) - GAP_Y;

  const root = svg('svg', { id: 'dag', class: 'dag', width, height, viewBox: `0 0 ${width} ${height}`,
    role: 'img', 'aria-label': `DAG of request ${req.id}` },
  svg('defs', {}, svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7,
    markerHeight: 7, orient: 'auto-start-reverse' }, svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'arrowhead' }))));
  for (const e of edges) {
    const a = pos.get(e.from);
    const b = pos.get(e.to);
    if (!a || !b) continue;
    const x1 = a.x + W; const y1 = a.y + H / 2; const x2 = b.x; const y2 = b.y + H / 2;
    const mx = (x1 + x2) / 2;
    root.append(svg('path', { class: 'edge', d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`,
      'marker-end': 'url(#arrow)', 'data-from': e.from, 'data-to': e.to }));
  }
  for (const n of nodes) {
    const p = pos.get(n.node_key);
    const cls = `node st-${n.node_state.toLowerCase()}${frontier.has(n.node_key) ? ' frontier' : ''}`;
    root.append(svg('g', { class: cls, transform: `translate(${p.x},${p.y})`, 'data-node-key': n.node_key,
      'data-state': n.node_state },
    svg('title', {}, `${n.node_key}: ${n.node_state} (${n.action_type}, attempt ${n.attempt_no})`),
    svg('rect', { width: W, height: H, rx: 6 }),
    svg('text', { x: 8, y: 20, class: 'key' }, n.node_key),
    svg('text', { x: 8, y: 40, class: 'state' }, `${n.node_state} · #${n.attempt_no}`)));
  }
  return root;
}
