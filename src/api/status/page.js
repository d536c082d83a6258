// sitegate status page: renders the snapshots the gateway sends on status/events
// (server-sent events). Data is only ever written as text (textContent), never as markup.
'use strict';
(function () {
  const SVG = 'http://www.w3.org/2000/svg';
  const TYPES = ['Alarm', 'Warn', 'Monitor'];
  const $ = (id) => document.getElementById(id);
  const acking = new Set();

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'text') e.textContent = v;
      else if (k === 'class') e.className = v;
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children || []) if (c) e.appendChild(c);
    return e;
  }

  function svg(tag, attrs, children) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'text') e.textContent = v;
      else e.setAttribute(k, String(v));
    }
    for (const c of children || []) if (c) e.appendChild(c);
    return e;
  }

  function ago(ms, now) {
    if (!ms) return '';
    const s = Math.max(0, Math.round((now - ms) / 1000));
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.round(s / 60) + ' min ago';
    if (s < 86400) return Math.round(s / 3600) + ' h ago';
    return Math.round(s / 86400) + ' d ago';
  }

  function bytes(n) {
    if (n >= 1 << 30) return (n / (1 << 30)).toFixed(1) + ' GiB';
    if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + ' MiB';
    if (n >= 1 << 10) return (n / (1 << 10)).toFixed(0) + ' KiB';
    return n + ' B';
  }

  function duration(s) {
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    return (d ? d + ' d ' : '') + (d || h ? h + ' h ' : '') + m + ' min';
  }

  function who(p) {
    return p.contactname || p.label || p.deviceaddress;
  }

  // Keeps keyboard focus on the same control across a re-render.
  function keepFocus(render) {
    const key = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : null;
    render();
    if (key) {
      const again = document.querySelector('[data-key="' + CSS.escape(key) + '"]');
      if (again) again.focus();
    }
  }

  function renderAlerts(snap) {
    const groups = $('alert-groups');
    groups.replaceChildren();
    const alerts = snap.alerts;
    for (const id of [...acking]) if (!alerts.some((a) => a.id === id)) acking.delete(id);
    $('alerts-none').hidden = alerts.length > 0;
    const count = $('alert-count');
    // The snapshot holds the most severe only: say how many are open in all.
    const total = snap.openalerts ?? alerts.length;
    count.textContent = total > alerts.length ? alerts.length + ' of ' + total : String(alerts.length);
    count.classList.toggle('hot', alerts.some((a) => a.type === 'Alarm'));
    for (const type of TYPES) {
      const mine = alerts.filter((a) => a.type === type);
      if (!mine.length) continue;
      const box = el('div', { class: 'alert-group ' + type, 'data-type': type }, [
        el('h3', {}, [el('span', { class: 'tag ' + type, text: type }), document.createTextNode(' ' + mine.length)]),
      ]);
      for (const a of mine) {
        const person = a.contactname ? a.contactname + ' (' + a.deviceaddress + ')' : a.deviceaddress;
        const button = el('button', {
          type: 'button',
          'data-key': 'ack-' + a.id,
          'data-alert': a.id,
          disabled: acking.has(a.id),
          text: acking.has(a.id) ? 'Acknowledging…' : 'Acknowledge',
          'aria-label': 'Acknowledge ' + type + ' alert: ' + a.text + ', ' + person,
        });
        button.addEventListener('click', () => acknowledge(a.id));
        box.appendChild(el('div', { class: 'alert', 'data-alert-id': a.id }, [
          el('div', { class: 'what' }, [
            el('strong', { text: a.text }),
            el('div', { class: 'muted', text: person + ' · ' + a.timestamp }),
          ]),
          button,
        ]));
      }
      groups.appendChild(box);
    }
  }

  function renderFloors(snap) {
    const floors = $('floors');
    floors.replaceChildren();
    const anyZone = snap.floors.some((f) => f.zones.length);
    $('zones-none').hidden = anyZone;
    for (const f of snap.floors) {
      if (!f.zones.length) continue;
      const title = (f.building ? f.building + ' · ' : '') + f.label;
      const people = f.zones.reduce((n, z) => n + z.people.length, 0);
      // As tall as the floor's zones need (a row of zones makes a short plan).
      const Y = (v) => 11 + v * 56;
      const lowest = Math.max(0, ...f.zones.map((z) => z.y), ...f.receivers.map((r) => r.y));
      const height = Math.min(82, Y(lowest) + 18);
      const plan = svg('svg', { viewBox: '0 0 100 ' + height.toFixed(1), role: 'img', 'aria-label': 'Plan of ' + title + ': ' + f.zones.length + ' zones, ' + people + ' people' });
      for (const z of f.zones) {
        const x = z.x * 100, y = Y(z.y);
        plan.appendChild(svg('circle', { class: 'zone-area' + (z.people.length ? ' busy' : ''), cx: x, cy: y, r: 9 }));
        plan.appendChild(svg('text', { class: 'zone-label', x: x, y: y + 12.5, text: z.name + (z.people.length ? ' (' + z.people.length + ')' : '') }));
        z.people.forEach((p, i) => {
          const angle = i * 2.39996 + 0.8, radius = 4 + 1.1 * Math.sqrt(i);
          plan.appendChild(svg('circle', { class: 'person', cx: x + radius * Math.cos(angle), cy: y + radius * Math.sin(angle), r: 1.6 }, [svg('title', { text: who(p) })]));
        });
      }
      for (const r of f.receivers) {
        plan.appendChild(svg('rect', { class: 'receiver' + (r.silent ? ' silent' : ''), x: r.x * 100 - 1.2, y: Y(r.y) - 1.2, width: 2.4, height: 2.4 }, [svg('title', { text: 'Receiver ' + r.id + (r.silent ? ' (silent)' : '') })]));
      }
      const list = el('ul', { class: 'zone-list' });
      for (const z of f.zones) {
        const li = el('li', { 'data-zone': z.id }, [
          el('span', { class: 'zone-name', text: z.name }),
          el('span', { class: 'muted', text: ' · ' + (z.people.length ? z.people.length + (z.people.length === 1 ? ' person' : ' people') : 'empty') }),
        ]);
        if (z.people.length) {
          const ul = el('ul', { class: 'people' });
          for (const p of z.people) {
            const device = p.contactname ? (p.label || p.deviceaddress) : p.deviceaddress;
            ul.appendChild(el('li', { 'data-device': p.deviceaddress }, [
              el('span', { text: who(p) }),
              el('span', { class: 'muted', text: (p.contactname ? ' · ' + device : '') + ' · since ' + p.since.slice(11, 16) + ' (' + ago(p.sincems, snap.nowms) + ')' }),
            ]));
          }
          li.appendChild(ul);
        }
        list.appendChild(li);
      }
      floors.appendChild(el('div', { class: 'floor', 'data-floor': f.id }, [
        el('h3', { text: title }),
        el('div', { class: 'floor-body' }, [el('div', { class: 'plan' }, [plan]), list]),
      ]));
    }
  }

  function renderDevices(snap) {
    const body = document.querySelector('#device-table tbody');
    body.replaceChildren();
    $('devices-none').hidden = snap.devices.length > 0;
    for (const d of snap.devices) {
      const battery = d.battery ? el('span', { class: d.batterylow ? 'low' : '', text: d.battery + ' V' + (d.batterylow ? ' (low)' : '') }) : el('span', { class: 'muted', text: 'unknown' });
      const signal = d.receiver ? d.receiver + (d.rssi !== null ? ' · ' + d.rssi + ' dBm' : '') : '';
      body.appendChild(el('tr', { 'data-device': d.deviceaddress }, [
        el('th', { scope: 'row', text: d.label || d.deviceaddress }),
        el('td', { text: d.contactname }),
        el('td', { text: d.zonename || (d.zoneid ? String(d.zoneid) : '') }),
        el('td', { class: d.lastseenms ? '' : 'stale', text: d.lastseenms ? d.lastseen.slice(11) + ' (' + ago(d.lastseenms, snap.nowms) + ')' : 'never' }),
        el('td', {}, [battery]),
        el('td', { text: signal }),
      ]));
    }
  }

  function renderHealth(snap) {
    const h = snap.health;
    const dl = $('health-list');
    dl.replaceChildren();
    const row = (term, text, bad) => {
      dl.appendChild(el('dt', { text: term }));
      dl.appendChild(el('dd', { class: bad ? 'bad' : '', 'data-health': term, text: text }));
    };
    row('BLE scan', h.scan + (h.lastadvert ? ' · last advert ' + h.lastadvert.slice(11) : ''), h.scan === 'waiting');
    row('Silent receivers', h.silentreceivers.length ? h.silentreceivers.join(', ') : 'none', h.silentreceivers.length > 0);
    const w = h.webhooks;
    // -1: the database could not be read (Storage says why).
    if (w.pending < 0) row('Webhooks', 'unknown', true);
    else row('Webhooks', w.pending + ' pending · ' + w.failed + ' failed' + (w.paused ? ' · ' + w.paused + ' paused' : ''), w.failed > 0 || w.paused > 0);
    row('MQTT clients', String(h.mqttconnections));
    row('Database', bytes(h.databasebytes));
    const free = h.diskfreebytes >= 0 ? bytes(h.diskfreebytes) + ' free' : '';
    row('Storage', [h.storage || 'ok', free].filter(Boolean).join(' · '), h.storage !== '' || h.disklow === 1);
    row('Uptime', duration(h.uptimes));
    row('Version', h.version);
  }

  function render(snap) {
    keepFocus(() => {
      renderAlerts(snap);
      renderFloors(snap);
      renderDevices(snap);
      renderHealth(snap);
    });
    $('clock').textContent = 'Gateway time ' + snap.now;
  }

  function setConn(live, text) {
    const c = $('conn');
    c.textContent = text || (live ? 'Live' : 'Reconnecting…');
    c.classList.toggle('live', live);
    c.classList.toggle('down', !live);
  }

  async function acknowledge(id) {
    acking.add(id);
    const button = document.querySelector('[data-alert="' + id + '"]');
    if (button) { button.disabled = true; button.textContent = 'Acknowledging…'; }
    try {
      // Resolved against the origin: a page opened with credentials in its URL would pass them
      // on, and fetch refuses such URLs (the browser sends the remembered ones anyway).
      const url = new URL('alerts/' + id + '/ack', location.origin + location.pathname);
      const r = await fetch(url, {
        method: 'POST',
        headers: { 'Accept': 'application/json', 'Content-Type': 'application/json' },
        body: '{}',
        credentials: 'same-origin',
      });
      if (!r.ok) throw new Error('the gateway answered ' + r.status);
      const row = document.querySelector('[data-alert-id="' + id + '"]');
      if (row) row.remove();
      $('notice').textContent = '';
    } catch (e) {
      acking.delete(id);
      if (button) { button.disabled = false; button.textContent = 'Acknowledge'; }
      $('notice').textContent = 'Could not acknowledge the alert: ' + e.message;
    }
  }

  // The browser retries a stream that broke by itself, but not one refused (a 503 while
  // every stream is taken, a 401 while a user is disabled): that is retried here, from 2 s
  // up to every 30 s, until a stream is accepted.
  let retryMs = 2000;
  function connect() {
    const events = new EventSource('status/events');
    events.addEventListener('snapshot', (e) => {
      setConn(true);
      retryMs = 2000;
      render(JSON.parse(e.data));
    });
    events.addEventListener('open', () => setConn(true));
    events.addEventListener('error', () => {
      setConn(false);
      if (events.readyState === EventSource.CLOSED) {
        setTimeout(connect, retryMs);
        retryMs = Math.min(retryMs * 2, 30000);
      }
    });
  }

  connect();
})();
