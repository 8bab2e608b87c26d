// rhea against amqpbroker: every case in one process (issue 21).
// Usage: node driver.js < job.json -> one JSON line. job.mode: cases | send | recv.
'use strict';
const fs = require('fs');
const rhea = require('rhea');

const JOB = JSON.parse(fs.readFileSync(0, 'utf8'));

// rhea 3.0.5 reads the one-byte boolean encoding (0x56 0x01, which azure's pyamqp sends
// for every boolean) as the number 1. Recorded before the fix, then fixed as a user would: by
// giving that type code a boolean reader (interop/README.md, "Client bugs").
const decode = (bytes) => new rhea.types.Reader(Buffer.from(bytes)).read().valueOf();
const BOOLEAN_0x56_BEFORE_FIX = decode([0x56, 0x01]);
rhea.types.by_code[0x56].read = (buffer, offset) => buffer.readUInt8(offset) !== 0;
const P = JOB.prefix;
let ids = 0;

function connect({ tls = false, password = JOB.password, id } = {}) {
  const container = rhea.create_container({ id: id || `rhea-${process.pid}-${ids++}` });
  const options = tls
    ? { transport: 'tls', host: JOB.tls_host, port: JOB.tls_port, ca: fs.readFileSync(JOB.ca), servername: JOB.tls_host }
    : { host: JOB.host, port: JOB.port };
  return new Promise((resolve, reject) => {
    const conn = container.connect({ ...options, username: JOB.user, password, reconnect: false });
    conn.on('connection_open', () => resolve(conn));
    conn.on('connection_error', (ctx) => reject(ctx.connection.get_error() || new Error('connection_error')));
    conn.on('disconnected', (ctx) => reject(new Error(String(ctx.error || 'disconnected'))));
  });
}

// A receiver whose deliveries are taken one at a time: next() -> {message, delivery}.
function receiver(conn, source, options = {}) {
  const queue = [];
  const waiting = [];
  const link = conn.open_receiver({ source, autoaccept: false, ...options });
  link.on('message', (ctx) => {
    const item = { message: ctx.message, delivery: ctx.delivery };
    if (waiting.length) waiting.shift()(item); else queue.push(item);
  });
  link.next = (ms = 10000) => new Promise((resolve, reject) => {
    if (queue.length) return resolve(queue.shift());
    const timer = setTimeout(() => reject(new Error(`nothing from ${JSON.stringify(source)}`)), ms);
    waiting.push((item) => { clearTimeout(timer); resolve(item); });
  });
  return new Promise((resolve) => link.once('receiver_open', () => resolve(link)));
}

// Send and wait until the broker settles every message (accepted).
function send(conn, target, messages) {
  return new Promise((resolve, reject) => {
    const link = conn.open_sender({ target });
    let accepted = 0;
    let started = false;
    link.on('sendable', () => {
      if (started) return;
      started = true;
      for (const m of messages) link.send(m);
    });
    link.on('accepted', () => { if (++accepted === messages.length) { link.close(); resolve(); } });
    link.on('rejected', (ctx) => reject(new Error(`rejected ${JSON.stringify(ctx.delivery.remote_state)}`)));
  });
}

async function take(conn, source, count, options) {
  const link = await receiver(conn, source, options);
  const out = [];
  for (let i = 0; i < count; i++) {
    const { message, delivery } = await link.next();
    delivery.accept();
    out.push(message);
  }
  return out;
}

const cases = {
  async queue(conn) {
    await send(conn, `q.${P}.order`, [0, 1, 2, 3, 4].map((i) => ({ body: `m${i}` })));
    return (await take(conn, `q.${P}.order`, 5)).map((m) => m.body);
  },
  async topic(conn) {
    const a = await receiver(conn, `t.${P}.news`);
    const b = await receiver(conn, `t.${P}.news`);
    await send(conn, `t.${P}.news`, [0, 1, 2].map((i) => ({ body: `n${i}` })));
    const out = [];
    for (const link of [a, b]) {
      const bodies = [];
      for (let i = 0; i < 3; i++) {
        const { message, delivery } = await link.next();
        delivery.accept();
        bodies.push(message.body);
      }
      out.push(bodies);
    }
    return out;
  },
  async reject(conn) {
    await send(conn, `q.${P}.rej`, [{ body: 'poison' }]);
    const link = await receiver(conn, `q.${P}.rej`);
    (await link.next()).delivery.reject({ condition: 'app:poison', description: 'cannot parse' });
    const [dead] = await take(conn, `DLA::DLQ.q.${P}.rej`, 1);
    return { body: dead.body, annotations: dead.message_annotations };
  },
  async modified(conn) {
    return redelivery(conn, `q.${P}.mod`, (d) => d.modified({ delivery_failed: true }));
  },
  async released(conn) {
    return redelivery(conn, `q.${P}.rel`, (d) => d.release());
  },
  async tls() {
    const conn = await connect({ tls: true });
    await send(conn, `q.${P}.tls`, [{ body: 'over-tls' }]);
    const [m] = await take(conn, `q.${P}.tls`, 1);
    conn.close();
    let refused = false;
    try {
      (await connect({ tls: true, password: 'wrong' })).close();
    } catch (e) {
      refused = /unauthorized|auth/i.test(`${e.condition} ${e.message}`);
    }
    return { body: m.body, wrong_password_refused: refused };
  },
  async large(conn) {
    const payload = Buffer.alloc(JOB.large);
    for (let i = 0; i < payload.length; i++) payload[i] = i % 256;
    await send(conn, `q.${P}.large`, [{ body: rhea.message.data_section(payload) }]);
    const [m] = await take(conn, `q.${P}.large`, 1);
    const got = bytesOf(m.body);
    return { size: got.length, same: Buffer.compare(got, payload) === 0 };
  },
  async durable(conn) {
    const id = `rhea-durable-${P}`;
    const source = { address: `t.${P}.dur`, durable: 2, expiry_policy: 'never' };
    const first = await connect({ id });
    await receiver(first, source, { name: 'sub' });
    first.close(); // the link is never closed: the subscription stays (B-028)
    await new Promise((resolve) => first.once('connection_close', resolve));
    await send(conn, `t.${P}.dur`, [{ body: 'd0' }, { body: 'd1' }]);
    const again = await connect({ id });
    const bodies = (await take(again, source, 2, { name: 'sub' })).map((m) => m.body);
    again.close();
    return bodies;
  },
  async shared(conn) {
    const source = { address: `t.${P}.shared`, durable: 2, expiry_policy: 'never', capabilities: ['shared', 'global'] };
    const one = await connect();
    const two = await connect();
    const links = [await receiver(one, source, { name: 'shsub' }), await receiver(two, source, { name: 'shsub' })];
    await send(conn, `t.${P}.shared`, [0, 1, 2, 3].map((i) => ({ body: `s${i}` })));
    const seen = [[], []];
    for (let round = 0; round < 40 && seen[0].length + seen[1].length < 4; round++) {
      for (let i = 0; i < 2; i++) {
        try {
          const { message, delivery } = await links[i].next(100);
          delivery.accept();
          seen[i].push(message.body);
        } catch (e) { /* nothing for this one now */ }
      }
    }
    one.close();
    two.close();
    return { bodies: [...seen[0], ...seen[1]].sort(), per_receiver: seen.map((s) => s.length) };
  },
};

// rhea 3.0.5 merges dispositions issued in the same tick into one range with the first
// outcome: `modified` for one delivery and `rejected` for the next go out as one
// modified(first=n, last=n+1). Both come back, nothing is dead-lettered (README).
async function dispositionMerge(conn) {
  const address = `q.${P}.merge`;
  await send(conn, address, [{ body: 'first' }, { body: 'second' }]);
  const link = await receiver(conn, address);
  const [a, b] = [await link.next(), await link.next()];
  a.delivery.modified({ delivery_failed: true });
  b.delivery.reject({ condition: 'app:bad', description: 'rejected in the same tick' });
  const back = [];
  for (let i = 0; i < 2; i++) {
    try {
      const { message, delivery } = await link.next(2000);
      delivery.accept();
      back.push({ body: message.body, delivery_count: message.delivery_count || 0 });
    } catch (e) { /* not redelivered: rhea did send the reject */ }
  }
  return back;
}

async function redelivery(conn, address, settle) {
  await send(conn, address, [{ body: 'again' }]);
  const link = await receiver(conn, address);
  const first = await link.next();
  settle(first.delivery);
  const second = await link.next();
  second.delivery.accept();
  return [first.message.delivery_count || 0, second.message.delivery_count || 0];
}

function bytesOf(body) {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.content);
}

// --- cross matrix ------------------------------------------------------------------------

function native(typed) {
  const { t, v } = typed;
  switch (t) {
    case 'binary': return Buffer.from(v, 'hex');
    case 'int': return rhea.types.wrap_int(v);
    case 'long': return rhea.types.wrap_long(v);
    case 'double': return rhea.types.wrap_double(v);
    case 'map': return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, native(x)]));
    case 'list': return v.map(native);
    default: return v;
  }
}

function plain(value) {
  if (Buffer.isBuffer(value)) return { hex: value.toString('hex') };
  if (Array.isArray(value)) return value.map(plain);
  if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([k, x]) => [k, plain(x)]));
  return value === undefined ? null : value;
}

async function matrixSend(conn) {
  for (const target of JOB.targets) {
    await send(conn, target, JOB.messages.map((m) => ({
      message_id: m.id,
      content_type: m.content_type,
      application_properties: Object.fromEntries(Object.entries(m.props).map(([k, x]) => [k, native(x)])),
      body: m.body.kind === 'data' ? rhea.message.data_section(native(m.body.value)) : native(m.body.value),
    })));
  }
  return { sent: true };
}

async function matrixRecv(conn) {
  const out = {};
  for (const source of JOB.sources) {
    out[source] = (await take(conn, source, JOB.count)).map((m) => {
      const data = m.body && m.body.typecode === 0x75;
      return {
        id: m.message_id,
        content_type: m.content_type,
        props: plain(m.application_properties || {}),
        body: { kind: data ? 'data' : 'value', value: plain(data ? bytesOf(m.body) : m.body) },
      };
    });
  }
  return { received: out };
}

async function main() {
  let result = {};
  if (JOB.mode === 'cases') {
    result.bool_0x56_decoded_as = BOOLEAN_0x56_BEFORE_FIX;
    const probe = await connect();
    result.disposition_merge = await dispositionMerge(probe).catch((e) => ({ error: String(e) }));
    probe.close();
    for (const [name, run] of Object.entries(cases)) {
      let conn;
      try {
        conn = await connect();
        result[name] = await run(conn);
      } catch (e) {
        result[name] = { error: String(e && e.stack || e) };
      }
      if (conn) conn.close();
    }
  } else {
    const conn = await connect();
    result = JOB.mode === 'send' ? await matrixSend(conn) : await matrixRecv(conn);
    conn.close();
  }
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0));
}

setTimeout(() => { console.error('driver timeout'); process.exit(2); }, 50000).unref();
main().catch((e) => { console.error(e); process.exit(1); });
