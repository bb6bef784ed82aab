// Reads COUNT records of TOPIC from the start with kafkajs at its default
// settings, as a consumer that nobody in this project wrote would, and
// prints one JSON object per record on stdout:
//
//   {"topic", "partition", "key", "headers": {name: [values...]}, "value",
//    "cloudevent": {...} | "cloudeventError": "..."}
//
// Every header keeps all of its values, in order, so a test sees repeats.
// With --cloudevents each record also goes through the CloudEvents SDK's
// Kafka binding (Kafka.toEvent) and the event's validation. With
// --confluent-avro URL or --confluent-json URL each value is decoded by
// Confluent's own deserializer (@confluentinc/schemaregistry), which fetches
// the writer's schema from the registry at URL by the id in the value's wire
// header (the JSON Schema one validates the value against it), and printed
// as "decoded", or "decodeError": "name: message".
//
// Exit codes: 0 read COUNT records; 3 the consumer crashed (the error's
// name and message are printed as {"crash": name, "message": text}); 2 a
// timeout or bad usage.
//
// usage: node kafka-read.js BROKER TOPIC COUNT [--cloudevents] [--confluent-avro|--confluent-json URL]
"use strict";

const { Kafka, logLevel } = require("kafkajs");

const [broker, topic, countArg, ...flags] = process.argv.slice(2);
const count = Number(countArg);
if (!broker || !topic || !(count > 0)) {
  console.error("usage: node kafka-read.js BROKER TOPIC COUNT [--cloudevents] [--confluent-avro|--confluent-json URL]");
  process.exit(2);
}
const withCloudEvents = flags.includes("--cloudevents");
const cloudevents = withCloudEvents ? require("cloudevents") : null;
const deserializer = confluentDeserializer();

function confluentDeserializer() {
  const i = flags.findIndex((f) => f === "--confluent-avro" || f === "--confluent-json");
  if (i < 0) return null;
  const sr = require("@confluentinc/schemaregistry");
  const client = new sr.SchemaRegistryClient({ baseURLs: [flags[i + 1]] });
  return flags[i] === "--confluent-avro"
    ? new sr.AvroDeserializer(client, sr.SerdeType.VALUE, {})
    : new sr.JsonDeserializer(client, sr.SerdeType.VALUE, { validate: true });
}

// Avro longs decode as numbers or, beyond 2^53, BigInts, which JSON lacks.
const bigints = (_, v) => (typeof v === "bigint" ? v.toString() : v);

const kafka = new Kafka({
  clientId: "outboxrelay-interop",
  brokers: [broker],
  logLevel: logLevel.ERROR,
  retry: { retries: 3 },
});
const consumer = kafka.consumer({ groupId: `interop-${process.pid}-${Date.now()}` });

function strings(v) {
  if (v === undefined || v === null) return [];
  return (Array.isArray(v) ? v : [v]).map((b) => b.toString("utf8"));
}

function toEvent(message) {
  // The SDK reads single-valued headers; a repeated one arrives as an
  // array, which is what made it answer "No CloudEvent detected" before.
  const headers = {};
  for (const [k, v] of Object.entries(message.headers || {})) {
    headers[k] = Array.isArray(v) ? v.map((b) => b.toString("utf8")) : v.toString("utf8");
  }
  const ev = cloudevents.Kafka.toEvent({
    key: message.key ? message.key.toString("utf8") : undefined,
    value: message.value.toString("utf8"),
    headers,
    timestamp: message.timestamp,
  });
  ev.validate();
  return ev.toJSON();
}

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
  console.error(`kafka-read: read ${seen} of ${count} records within 30 s`);
  finish(2);
}, 30000);

consumer.on(consumer.events.CRASH, ({ payload }) => {
  const e = payload.error || {};
  process.stdout.write(JSON.stringify({ crash: e.name, message: e.message }) + "\n");
  finish(3);
});

(async () => {
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    eachMessage: async ({ topic, partition, message }) => {
      if (seen >= count) return;
      const out = {
        topic,
        partition,
        key: message.key ? message.key.toString("utf8") : null,
        headers: {},
        value: message.value ? message.value.toString("utf8") : null,
      };
      for (const [k, v] of Object.entries(message.headers || {})) out.headers[k] = strings(v);
      if (withCloudEvents) {
        try {
          out.cloudevent = toEvent(message);
        } catch (e) {
          out.cloudeventError = `${e.name}: ${e.message}${e.errors ? " " + JSON.stringify(e.errors) : ""}`;
        }
      }
      if (deserializer) {
        try {
          out.decoded = await deserializer.deserialize(topic, message.value);
        } catch (e) {
          out.decodeError = `${e.name}: ${e.message}`;
        }
      }
      process.stdout.write(JSON.stringify(out, bigints) + "\n");
      // Not awaited: disconnect waits for this handler to return.
      if (++seen === count) setImmediate(() => finish(0));
    },
  });
})().catch((e) => {
  console.error(`kafka-read: ${e.name}: ${e.message}`);
  finish(2);
});
