// rhea with SASL PLAIN against a secured amqpbroker: send one message, print the outcome.
// Usage: node plain.js PORT USER PASSWORD  -> prints {"accepted": true} or {"error": ...}
'use strict';
const rhea = require('rhea');
const [port, username, password] = [Number(process.argv[2]), process.argv[3], process.argv[4]];
const container = rhea.create_container({ id: 'rhea-plain' });
const done = (result) => { console.log(JSON.stringify(result)); process.exit(0); };
setTimeout(() => done({ error: 'timeout' }), 10000);
container.on('sendable', (context) => {
  if (!context.sender.sent) {
    context.sender.sent = true;
    context.sender.send({ body: 'authenticated' });
  }
});
container.on('accepted', () => done({ accepted: true }));
container.on('connection_error', (context) => done({ error: String(context.connection.error) }));
container.on('disconnected', (context) => done({ error: String(context.error || 'disconnected') }));
const conn = container.connect({ host: '127.0.0.1', port, username, password, reconnect: false });
conn.open_sender({ target: { address: 'rhea.secured', capabilities: ['queue'] } });
