#!/usr/bin/env node
// Streams a completion from a splitspec router over gRPC, loading protos/generation.proto at
// run time (no generated code):
//   node generate.js [--address HOST:PORT] [--tls-ca FILE] [--tls-client-cert FILE
//                    --tls-client-key FILE] [--max-tokens N] [--temperature T] [--raw] [--json]
//                    PROMPT
// Without --json the text is printed as it arrives and a summary goes to stderr; with --json
// every stream item is printed as one JSON line (what the CI test reads). A router with an API
// key gets the one in $SPLITSPEC_API_KEY; one serving TLS wants --tls-ca (its CA, PEM), and one
// that asks for client certificates (its --tls-client-ca) --tls-client-cert and --tls-client-key
// as well (PEM, signed by that CA).
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = path.join(__dirname, '..', '..', 'protos', 'generation.proto');

function parseArgs(argv) {
  const opts = {
    address: '127.0.0.1:50051', tlsCa: null, clientCert: null, clientKey: null, maxTokens: 64,
    temperature: 0, raw: false, json: false,
  };
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--address') opts.address = argv[++i];
    else if (arg === '--tls-ca') opts.tlsCa = argv[++i];
    else if (arg === '--tls-client-cert') opts.clientCert = argv[++i];
    else if (arg === '--tls-client-key') opts.clientKey = argv[++i];
    else if (arg === '--max-tokens') opts.maxTokens = Number(argv[++i]);
    else if (arg === '--temperature') opts.temperature = Number(argv[++i]);
    else if (arg === '--raw') opts.raw = true;
    else if (arg === '--json') opts.json = true;
    else rest.push(arg);
  }
  if (rest.length !== 1) {
    throw new Error('usage: generate.js [--address A] [--tls-ca FILE] [--tls-client-cert FILE '
      + '--tls-client-key FILE] [--max-tokens N] [--temperature T] [--raw] [--json] PROMPT');
  }
  checkClientCert(opts);
  opts.prompt = rest[0];
  return opts;
}

// A client certificate goes with its key, and only over TLS (gRPC presents it in the handshake).
function checkClientCert(opts) {
  if (Boolean(opts.clientCert) !== Boolean(opts.clientKey)) {
    throw new Error('--tls-client-cert and --tls-client-key go together: pass both or neither');
  }
  if (opts.clientCert && !opts.tlsCa) {
    throw new Error('--tls-client-cert needs --tls-ca: a client certificate is sent over TLS only');
  }
}

function credentials(opts) {
  if (!opts.tlsCa) return grpc.credentials.createInsecure();
  const read = (file) => (file ? fs.readFileSync(file) : null);
  return grpc.credentials.createSsl(read(opts.tlsCa), read(opts.clientKey), read(opts.clientCert));
}

function client(opts) {
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  const { Generation } = grpc.loadPackageDefinition(definition).splitspec.v1;
  return new Generation(opts.address, credentials(opts));
}

function metadata() {
  const md = new grpc.Metadata();
  const key = (process.env.SPLITSPEC_API_KEY || '').trim();
  if (key) md.set('authorization', `Bearer ${key}`);
  return md;
}

function request(opts) {
  // The chat template is applied by the router; --raw sends the prompt as plain text.
  const input = opts.raw
    ? { text: opts.prompt }
    : { messages: { items: [{ role: 'user', content: opts.prompt }] } };
  return { ...input, sampling: { max_new_tokens: opts.maxTokens, temperature: opts.temperature } };
}

function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (err) { // a usage error: one line, as the Python CLI's, not a stack trace
    process.stderr.write(`error: ${err.message}\n`);
    process.exitCode = 2;
    return;
  }
  const stub = client(opts);
  const deadline = new Date(Date.now() + 300 * 1000);
  const call = stub.Generate(request(opts), metadata(), { deadline });
  call.on('data', (item) => {
    if (opts.json) {
      process.stdout.write(JSON.stringify(item) + '\n');
    } else {
      process.stdout.write(item.text);
      if (item.finish_reason !== 'FINISH_REASON_UNSPECIFIED') {
        const u = item.usage;
        process.stderr.write(`\n[${item.finish_reason}: ${u.prompt_tokens} prompt + `
          + `${u.completion_tokens} completion tokens]\n`);
      }
    }
  });
  call.on('error', (err) => {
    process.stderr.write(`error: ${err.code} ${err.details}\n`);
    process.exitCode = 1;
  });
  call.on('end', () => stub.close());
}

main();
