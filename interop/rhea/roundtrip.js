// rhea against amqpbroker: send, fail once (modified delivery-failed), accept the
// redelivery, reject another and read it from the auto-created dead-letter queue.
// Usage: node roundtrip.js PORT ADDRESS   -> prints one JSON line with what it saw.
'use strict';
const rhea = require('rhea');

const port = Number(process.argv[2]);
const address = process.argv[3];
const seen = { deliveries: [], dead: null, accepted_by_broker: 0 };
const container = rhea.create_container({ id: 'rhea-interop' });
const timer = setTimeout(() => { console.log(JSON.stringify({ error: 'timeout', ...seen })); process.exit(1); }, 15000);

container.on('connection_open', (context) => {
  const conn = context.connection;
  const queue = { address, capabilities: ['queue'] };
  // credit_window 1: one delivery in flight at a time. rhea 3.0.5 merges two dispositions
  // issued in the same tick into one range with the FIRST outcome (see ../README.md).
  conn.open_receiver({ source: queue, autoaccept: false, credit_window: 1 });
  const sender = conn.open_sender({ target: queue });
  sender.on('sendable', () => {
    if (sender.sent) return;
    sender.sent = true;
    sender.send({ body: 'fail-once', application_properties: { kind: 'retry' } });
    sender.send({ body: 'poison', application_properties: { kind: 'reject' } });
  });
  sender.on('accepted', () => { seen.accepted_by_broker += 1; });
});

container.on('message', (context) => {
  const message = context.message;
  if (context.receiver.source.address.startsWith('DLA::')) {
    seen.dead = {
      body: message.body,
      annotations: message.message_annotations,
      delivery_count: message.delivery_count || 0,
    };
    context.delivery.accept();
    clearTimeout(timer);
    console.log(JSON.stringify(seen));
    context.connection.close();
    return;
  }
  seen.deliveries.push({ body: message.body, delivery_count: message.delivery_count || 0 });
  if (message.body === 'fail-once' && !message.delivery_count) {
    context.delivery.modified({ delivery_failed: true });
  } else if (message.body === 'poison') {
    context.delivery.reject({ condition: 'app:poison', description: 'cannot parse' });
    context.connection.open_receiver({ source: { address: 'DLA::DLQ.' + address } });
  } else {
    context.delivery.accept();
  }
});

container.connect({ host: '127.0.0.1', port, reconnect: false });
