"use strict";
// The status page: polls status.json once a second and redraws. Rates come
// from two successive samples of each node's counters.
(function () {
  const prev = {}; // node name -> last sample
  const rates = {}; // node name -> {acc, drop}
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  }
  const fmtRate = (r) => r == null ? "–" : r >= 1e6 ? (r / 1e6).toFixed(1) + "M" : r >= 1e4 ? (r / 1e3).toFixed(0) + "k" : r.toFixed(0);
  const fmtDur = (ns) => { const ms = ns / 1e6; return ms < 1000 ? ms.toFixed(0) + " ms" : (ms / 1000).toFixed(2) + " s"; };
  const fmtTime = (t) => new Date(t).toLocaleTimeString();
  function ago(t, now) {
    const s = Math.max(0, (new Date(now) - new Date(t)) / 1000);
    if (s < 90) return s.toFixed(0) + " s";
    if (s < 5400) return (s / 60).toFixed(0) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function updateRates(n) {
    const s = n.sample;
    if (!s) { delete prev[n.name]; delete rates[n.name]; return; }
    const p = prev[n.name];
    if (p && s.at !== p.at) {
      const dt = (new Date(s.at) - new Date(p.at)) / 1000;
      if (dt > 0 && s.accepted >= p.accepted && s.dropped >= p.dropped) {
        rates[n.name] = { acc: (s.accepted - p.accepted) / dt, drop: (s.dropped - p.dropped) / dt };
      }
    }
    prev[n.name] = s;
  }

  function nodeCard(n) {
    const s = n.sample;
    const admin = s ? s.admin : n.admin;
    const cls = ["card"];
    if (!n.live) cls.push("dead");
    else if (admin === "draining") cls.push("draining");
    else if (n.eligible) cls.push("eligible");
    const flag = (name, on) => el("span", { class: "flag " + (on ? "on" : "off"), "data-flag": name, text: name });
    const r = rates[n.name] || {};
    const num = (field, v, label) => el("div", { class: "num" }, el("b", { "data-field": field, text: v }), el("span", { text: label }));
    return el("div", { class: cls.join(" "), "data-node": n.name, "data-admin": admin },
      el("span", { class: "state", "data-field": "state", text: admin }),
      el("div", { class: "name", text: n.name }),
      el("div", { class: "flags" }, flag("alive", n.live), flag("healthy", n.healthy), flag("eligible", n.eligible),
        s ? flag("converged", s.converged) : null),
      s ? el("div", { class: "nums" },
        num("accepted-rate", fmtRate(r.acc), "accepted pkt/s"),
        num("dropped-rate", fmtRate(r.drop), "dropped pkt/s"),
        num("connections", String(s.connections), "connections"),
        num("accepted", String(s.accepted), "accepted"),
        num("dropped", String(s.dropped), "dropped"),
        num("draining", String(s.draining), "draining buckets"))
        : el("div", { class: "err", text: "no counters: " + (n.sample_error || "unreachable") }));
  }

  function render(d) {
    const c = $("cluster");
    c.textContent = (d.converged ? "converged" : "converging") + " for " + ago(d.converged_since, d.time);
    c.className = "pill " + (d.converged ? "ok" : "warn");
    c.dataset.converged = d.converged;
    $("meta").textContent = "as seen by " + d.self + " · rules index " + d.rules_index + " · leader " + (d.leader || "none") +
      " · VIPs " + (d.vips || []).join(", ") + " · " + fmtTime(d.time);

    const nodes = d.nodes || [];
    nodes.forEach(updateRates);
    $("nodes").replaceChildren(...nodes.map(nodeCard));

    const draining = nodes.filter((n) => (n.sample ? n.sample.admin : n.admin) === "draining");
    $("drain-section").hidden = draining.length === 0;
    $("drain").replaceChildren(...draining.map((n) => el("div", { class: "card draining", "data-drain": n.name },
      el("div", { class: "name", text: n.name }),
      el("div", { "data-field": "remaining", text: n.sample ? n.sample.connections + " connections left, " + n.sample.draining + " buckets draining" : "remaining connections unknown" }))));

    $("rules").replaceChildren(...(d.rules || []).map((r) => {
      const box = el("div", { class: "rule", "data-rule": String(r.id) },
        el("div", { class: "title", text: "rule " + r.id + " · " + r.vip + ":" + r.ports + "/" + r.proto + " " },
          el("small", { text: r.mode + ", affinity " + r.affinity + ", " + r.state })));
      for (const n of nodes) {
        const share = (n.share && n.share[r.id]) || 0;
        box.append(el("div", { class: "share", "data-node": n.name },
          el("span", { text: n.name }),
          el("div", { class: "bar" }, el("i", { style: "width:" + (100 * share).toFixed(1) + "%" })),
          el("span", { class: "pct", text: (100 * share).toFixed(1) + "%" })));
      }
      return box;
    }));

    const bgp = d.bgp;
    $("bgp-section").hidden = !bgp;
    if (bgp) {
      const announced = Object.keys(bgp.announced || {});
      $("bgp").replaceChildren(...(bgp.sessions || []).map((s) => el("li", { "data-neighbor": s.neighbor },
        el("span", { text: s.neighbor + " (AS " + s.asn + "): " + s.state + (s.bfd ? ", BFD " + s.bfd : "") }),
        el("span", { class: "muted", text: s.last_error ? " · " + s.last_error : "" }))),
        el("li", { class: "muted", text: announced.length ? "announcing " + announced.join(", ") : "announcing nothing (not eligible)" }));
    }

    const fw = d.forwarding;
    $("forwarding-section").hidden = !fw;
    if (fw) {
      $("forwarding").replaceChildren(...(fw.on ? (fw.peers || []).map((p) => el("li", { "data-peer": p.node },
        el("span", { text: p.node + ": " + p.forwarded + " to it as owner, " + p.second_chance + " as second chance, " + p.received + " from it" })))
        : [el("li", { text: "off: plain ECMP, every packet kept where the router sent it" })]),
        el("li", { class: "muted", text: "not forwarded: " + fw.foreign + " from strangers, " + fw.no_route + " without a next hop, " +
          fw.hop_limit + " past the hop limit, " + fw.too_big + " over the MTU" }));
    }

    const views = d.view_changes || [];
    $("views").replaceChildren(...(views.length ? views.map((v) => el("li", {},
      el("time", { text: fmtTime(v.at) }),
      el("span", { text: v.cause + " → [" + (v.to || []).join(", ") + "]" }),
      el("span", { class: "muted", text: v.converged ? " · converged in " + fmtDur(v.converged_after) : " · not converged" })))
      : [el("li", { class: "muted", text: "none since this agent started" })]));

    const fo = d.failovers || [];
    $("failovers").replaceChildren(...(fo.length ? fo.map((f) => el("li", { "data-failover": f.node },
      el("time", { text: fmtTime(f.last_seen) }), el("span", { text: f.node + ": " + fmtDur(f.duration) })))
      : [el("li", { class: "muted", text: "none since this agent started" })]));
  }

  async function tick() {
    try {
      const r = await fetch("status.json", { cache: "no-store" });
      if (!r.ok) throw new Error(r.status + " " + r.statusText);
      render(await r.json());
      $("footer").dataset.updated = Date.now();
    } catch (e) {
      const c = $("cluster");
      c.textContent = "agent unreachable: " + e.message;
      c.className = "pill";
    }
  }
  tick();
  setInterval(tick, 1000);
})();
