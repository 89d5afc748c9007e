// Reads a JSON array of JSON texts on standard input and writes, as one JSON
// array, the canonical form of each by npm's `canonicalize` (RFC 8785's
// JavaScript reference), installed under <dir>/node_modules (the first
// argument). test_canonjson.py compares src/canonjson.c with it. Loaded with
// import(), which takes the CommonJS of its 1.x-2.x and the ES module of 3.x on.
'use strict';
const fs = require('fs');
const path = require('path');
const url = require('url');

const dir = path.join(process.argv[2], 'node_modules', 'canonicalize');
const main = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).main;
const chunks = [];
process.stdin.on('data', (c) => chunks.push(c));
process.stdin.on('end', () => {
  import(url.pathToFileURL(path.join(dir, main || 'index.js')).href).then((mod) => {
    const canonicalize = typeof mod.default === 'function' ? mod.default : mod.canonicalize;
    const texts = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    process.stdout.write(JSON.stringify(texts.map((t) => canonicalize(JSON.parse(t)))));
  }).catch((err) => {
    console.error(err);
    process.exit(1);
  });
});
