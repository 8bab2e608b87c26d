// amqp10 (an older, independent Node.js AMQP 1.0 stack) against amqpbroker (issue 21).
// Usage: node driver.js < job.json -> one JSON line. job.mode: cases | send | recv.
'use strict';
const fs = require('fs');
const amqp10 = require('amqp10');

const { Client, Policy, translator, DescribedType } = amqp10;
const JOB = JSON.parse(fs.readFileSync(0, 'utf8'));
const P = JOB.prefix;
let ids = 0;

// Receivers settle explicitly, and accept any size: amqp10's default receiver attach says
// max-message-size 10000 ("arbitrary choice" in its policy.js).
const RECEIVER = { attach: { rcvSettleMode: 1, maxMessageSize: 0 } };

// amqp10's connect() promise does not reject on a SASL failure: the outcome shows only as
// a client 'client:errorReceived' / 'disconnected' event, so both are raced here.
function connect({ tls = false, password = JOB.password, id } = {}) {
  const options = { containerId: id || `amqp10-${process.pid}-${ids++}` };
  if (tls) options.sslOptions = { ca: fs.readFileSync(JOB.ca), servername: JOB.tls_host };
  const client = new Client(Policy.merge({ connect: { options }, reconnect: null }));
  const user = `${encodeURIComponent(JOB.user)}:${encodeURIComponent(password)}`;
  const url = tls ? `amqps://${user}@${JOB.tls_host}:${JOB.tls_port}` : `amqp://${user}@${JOB.host}:${JOB.port}`;
  return new Promise((resolve, reject) => {
    client.on('client:errorReceived', (e) => reject(e));
    client.on('disconnected', () => reject(new Error('disconnected')));
    client.connect(url).then(() => resolve(client), reject);
  });
}

async function receiver(client, source, overrides = {}) {
  const queue = [];
  const waiting = [];
  const link = await client.createReceiver(source, Policy.Utils.Merge(overrides, RECEIVER));
  link.on('message', (message) => {
    if (waiting.length) waiting.shift()(message); else queue.push(message);
  });
  link.next = (ms = 10000) => new Promise((resolve, reject) => {
    if (queue.length) return resolve(queue.shift());
    const timer = setTimeout(() => reject(new Error(`nothing from ${source}`)), ms);
    waiting.push((m) => { clearTimeout(timer); resolve(m); });
  });
  return link;
}

async function send(client, target, messages) {
  const link = await client.createSender(target);
  for (const m of messages) await link.send(m.body, m.options || {});
  await link.detach();
}

async function take(client, source, count, overrides) {
  const link = await receiver(client, source, overrides);
  const out = [];
  for (let i = 0; i < count; i++) {
    const m = await link.next();
    link.accept(m);
    out.push(m);
  }
  return out;
}

const deliveryCount = (m) => (m.header && m.header.deliveryCount) || 0;

const cases = {
  async queue(c) {
    await send(c, `q.${P}.order`, [0, 1, 2, 3, 4].map((i) => ({ body: `m${i}` })));
    return (await take(c, `q.${P}.order`, 5)).map((m) => m.body);
  },
  async topic(c) {
    const links = [await receiver(c, `t.${P}.news`), await receiver(c, `t.${P}.news`)];
    await send(c, `t.${P}.news`, [0, 1, 2].map((i) => ({ body: `n${i}` })));
    const out = [];
    for (const link of links) {
      const bodies = [];
      for (let i = 0; i < 3; i++) {
        const m = await link.next();
        link.accept(m);
        bodies.push(m.body);
      }
      out.push(bodies);
    }
    return out;
  },
  async reject(c) {
    await send(c, `q.${P}.rej`, [{ body: 'poison' }]);
    const link = await receiver(c, `q.${P}.rej`);
    link.reject(await link.next(), { condition: 'app:poison', description: 'cannot parse' });
    const [dead] = await take(c, `DLA::DLQ.q.${P}.rej`, 1);
    return { body: dead.body, annotations: dead.messageAnnotations };
  },
  async modified(c) {
    return redelivery(c, `q.${P}.mod`, (link, m) => link.modify(m, { deliveryFailed: true }));
  },
  async released(c) {
    return redelivery(c, `q.${P}.rel`, (link, m) => link.release(m));
  },
  async tls() {
    const c = await connect({ tls: true });
    await send(c, `q.${P}.tls`, [{ body: 'over-tls' }]);
    const [m] = await take(c, `q.${P}.tls`, 1);
    await c.disconnect();
    let refused = false;
    try {
      await (await connect({ tls: true, password: 'wrong' })).disconnect();
    } catch (e) {
      refused = /auth|sasl|disconnected/i.test(String(e && (e.message || e.condition || e)));
    }
    return { body: m.body, wrong_password_refused: refused };
  },
  async large(c) {
    const payload = Buffer.alloc(JOB.large);
    for (let i = 0; i < payload.length; i++) payload[i] = i % 256;
    await send(c, `q.${P}.large`, [{ body: payload }]);
    const [m] = await take(c, `q.${P}.large`, 1);
    return { size: m.body.length, same: Buffer.compare(m.body, payload) === 0 };
  },
  async durable(c) {
    const id = `amqp10-durable-${P}`;
    const sub = { name: 'sub', attach: { source: { durable: 2, expiryPolicy: 'never' } } };
    const first = await connect({ id });
    await receiver(first, `t.${P}.dur`, sub);
    await first.disconnect(); // the link is never detached: the subscription stays (B-028)
    await send(c, `t.${P}.dur`, [{ body: 'd0' }, { body: 'd1' }]);
    const again = await connect({ id });
    const bodies = (await take(again, `t.${P}.dur`, 2, sub)).map((m) => m.body);
    await again.disconnect();
    return bodies;
  },
  async shared(c) {
    const sub = {
      name: 'shsub',
      attach: { source: { durable: 2, expiryPolicy: 'never', capabilities: ['shared', 'global'] } },
    };
    const one = await connect();
    const two = await connect();
    const links = [await receiver(one, `t.${P}.shared`, sub), await receiver(two, `t.${P}.shared`, sub)];
    await send(c, `t.${P}.shared`, [0, 1, 2, 3].map((i) => ({ body: `s${i}` })));
    const seen = [[], []];
    for (let round = 0; round < 40 && seen[0].length + seen[1].length < 4; round++) {
      for (let i = 0; i < 2; i++) {
        try {
          const m = await links[i].next(100);
          links[i].accept(m);
          seen[i].push(m.body);
        } catch (e) { /* nothing for this one now */ }
      }
    }
    await one.disconnect();
    await two.disconnect();
    return { bodies: [...seen[0], ...seen[1]].sort(), per_receiver: seen.map((s) => s.length) };
  },
};

// How amqp10 reports a wrong password: the connect() promise and the client event apart.
function saslFailureReport() {
  const client = new Client(Policy.merge({ reconnect: null }));
  const seen = { event: null, promise: null };
  client.on('client:errorReceived', (e) => { seen.event = seen.event || String(e); });
  const url = `amqp://${JOB.user}:wrong@${JOB.host}:${JOB.port}`;
  return client.connect(url).then(
    () => ({ ...seen, promise: 'resolved' }),
    (e) => ({ ...seen, promise: e && e.name }),
  );
}

async function redelivery(c, address, settle) {
  await send(c, address, [{ body: 'again' }]);
  const link = await receiver(c, address);
  const first = await link.next();
  settle(link, first);
  const second = await link.next();
  link.accept(second);
  return [deliveryCount(first), deliveryCount(second)];
}

// --- cross matrix ------------------------------------------------------------------------

function native(typed) {
  const { t, v } = typed;
  switch (t) {
    case 'binary': return Buffer.from(v, 'hex');
    case 'int': case 'long': case 'double': return translator([t, v]);
    case 'map': return translator(['map', ...Object.entries(v).flatMap(([k, x]) => [k, native(x)])]);
    case 'list': return translator(['list', ...v.map(native)]);
    default: return v;
  }
}

function plain(value) {
  if (Buffer.isBuffer(value)) return { hex: value.toString('hex') };
  if (Array.isArray(value)) return value.map(plain);
  if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([k, x]) => [k, plain(x)]));
  return value === undefined ? null : value;
}

async function matrixSend(c) {
  for (const target of JOB.targets) {
    await send(c, target, JOB.messages.map((m) => ({
      body: m.body.kind === 'data' ? native(m.body.value) : new DescribedType(0x77, native(m.body.value)),
      options: {
        properties: { messageId: m.id, contentType: m.content_type },
        applicationProperties: Object.fromEntries(Object.entries(m.props).map(([k, x]) => [k, native(x)])),
      },
    })));
  }
  return { sent: true };
}

async function matrixRecv(c) {
  const out = {};
  for (const source of JOB.sources) {
    out[source] = (await take(c, source, JOB.count)).map((m) => ({
      id: m.properties.messageId,
      content_type: m.properties.contentType,
      props: plain(m.applicationProperties || {}),
      body: { kind: Buffer.isBuffer(m.body) ? 'data' : 'value', value: plain(m.body) },
    }));
  }
  return { received: out };
}

async function main() {
  let result = {};
  if (JOB.mode === 'cases') {
    result.sasl_failure_report = await saslFailureReport();
    for (const [name, run] of Object.entries(cases)) {
      let c;
      try {
        c = await connect();
        result[name] = await run(c);
      } catch (e) {
        result[name] = { error: String(e && e.stack || e) };
      }
      if (c) await c.disconnect().catch(() => {});
    }
  } else {
    const c = await connect();
    result = JOB.mode === 'send' ? await matrixSend(c) : await matrixRecv(c);
    await c.disconnect();
  }
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0));
}

setTimeout(() => { console.error('driver timeout'); process.exit(2); }, 50000).unref();
main().catch((e) => { console.error(e); process.exit(1); });
