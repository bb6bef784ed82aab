// Verifies captured webhook requests with the standardwebhooks package,
// once per secret given as an argument. Reads one JSON object a line on
// stdin, {"headers": {...}, "body": "<base64>"}, and prints one a line,
// {"id": ..., "ok": [true|false per secret], "errors": [...]}.
"use strict";
const { Webhook } = require("standardwebhooks");
const readline = require("readline");

const hooks = process.argv.slice(2).map((s) => new Webhook(s));
const rl = readline.createInterface({ input: process.stdin });
rl.on("line", (line) => {
  if (!line.trim()) return;
  const req = JSON.parse(line);
  const body = Buffer.from(req.body, "base64");
  const ok = [];
  const errors = [];
  for (const wh of hooks) {
    try {
      wh.verify(body, req.headers);
      ok.push(true);
      errors.push("");
    } catch (e) {
      ok.push(false);
      errors.push(String(e && e.message));
    }
  }
  process.stdout.write(JSON.stringify({ id: req.headers["webhook-id"], ok, errors }) + "\n");
});
