// Reads COUNT records of TOPIC from the start with kafkajs and decodes each
// value with Confluent's own deserializer (@confluentinc/schemaregistry),
// which fetches the writer's schema from the registry at REGISTRY by the id
// in the value's wire header, as a registry-aware consumer would. Prints one
// JSON object per record on stdout:
//
//   {"key", "headers": {name: value}, "value": <decoded>} or
//   {"key", "headers", "error": "name: message"} when the value does not decode
//
// FORMAT is avro or json (the JSON Schema deserializer, which validates the
// value against the schema). Exit codes: 0 read COUNT records; 2 a timeout
// or bad usage.
//
// usage: node confluent-read.js BROKER TOPIC COUNT REGISTRY FORMAT
"use strict";

const { Kafka, logLevel } = require("kafkajs");
const sr = require("@confluentinc/schemaregistry");

const [broker, topic, countArg, registry, format] = process.argv.slice(2);
const count = Number(countArg);
if (!broker || !topic || !(count > 0) || !registry || !["avro", "json"].includes(format)) {
  console.error("usage: node confluent-read.js BROKER TOPIC COUNT REGISTRY avro|json");
  process.exit(2);
}

const client = new sr.SchemaRegistryClient({ baseURLs: [registry] });
const deserializer =
  format === "avro"
    ? new sr.AvroDeserializer(client, sr.SerdeType.VALUE, {})
    : new sr.JsonDeserializer(client, sr.SerdeType.VALUE, { validate: true });

const kafka = new Kafka({
  clientId: "outboxrelay-interop",
  brokers: [broker],
  logLevel: logLevel.ERROR,
  retry: { retries: 3 },
});
const consumer = kafka.consumer({ groupId: `interop-sr-${process.pid}-${Date.now()}` });

let seen = 0;
let finished = false;
async function finish(code) {
  if (finished) return;
  finished = true;
  clearTimeout(timer);
  await consumer.disconnect().catch(() => {});
  process.exit(code);
}
const timer = setTimeout(() => {
  console.error(`confluent-read: read ${seen} of ${count} records within 60 s`);
  finish(2);
}, 60000);

// Avro longs decode as numbers or BigInts, depending on their size.
const plain = (_, v) => (typeof v === "bigint" ? v.toString() : v);

(async () => {
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    eachMessage: async ({ message }) => {
      if (seen >= count) return;
      const out = { key: message.key ? message.key.toString("utf8") : null, headers: {} };
      for (const [k, v] of Object.entries(message.headers || {})) out.headers[k] = v.toString("utf8");
      try {
        out.value = await deserializer.deserialize(topic, message.value);
      } catch (e) {
        out.error = `${e.name}: ${e.message}`;
      }
      process.stdout.write(JSON.stringify(out, plain) + "\n");
      if (++seen === count) setImmediate(() => finish(0));
    },
  });
})().catch((e) => {
  console.error(`confluent-read: ${e.name}: ${e.message}`);
  finish(2);
});
