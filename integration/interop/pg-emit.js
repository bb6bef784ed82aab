// Calls outboxrelay.emit from Node's pg driver inside a transaction, as a
// service in Node would: one event with a header and a traceparent, then
// one with a reserved header, whose error it prints. Prints one JSON line:
// {"id": "<message id>", "refused": {"code": "22023", "message": "..."}}.
// Usage: node pg-emit.js DATABASE_URL
'use strict';
const { Client } = require('pg');

async function main() {
  const client = new Client({ connectionString: process.argv[2] });
  await client.connect();
  const out = {};
  try {
    await client.query('BEGIN');
    const r = await client.query(
      'SELECT outboxrelay.emit($1, $2, $3, $4, $5, $6) AS id',
      ['order', 'node-1', 'order.created', { from: 'node' }, { tenant: 'acme' },
        '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01']);
    await client.query('COMMIT');
    out.id = r.rows[0].id;
    try {
      await client.query('SELECT outboxrelay.emit($1, $2, $3, $4, $5)',
        ['order', 'node-1', 'order.created', {}, { message_id: 'spoof' }]);
      out.refused = null;
    } catch (err) {
      out.refused = { code: err.code, message: err.message };
    }
  } finally {
    await client.end();
  }
  console.log(JSON.stringify(out));
}

main().catch((err) => { console.error(err); process.exit(1); });
