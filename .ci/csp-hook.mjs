// Trunk post-build hook: allow exactly the inline bootstrap script Trunk writes
// into index.html, by adding its SHA-256 to the Content-Security-Policy's
// script-src. Everything else stays 'self'-only, so no remote script can run.

import { readFileSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import path from "node:path";

const dir = process.env.TRUNK_STAGING_DIR;
if (!dir) {
  console.error("csp-hook: TRUNK_STAGING_DIR is not set; run it as a Trunk post_build hook");
  process.exit(1);
}
const file = path.join(dir, "index.html");
let html = readFileSync(file, "utf8");
const hashes = [];
for (const match of html.matchAll(/<script(?![^>]*\bsrc=)[^>]*>([\s\S]*?)<\/script>/g)) {
  const digest = createHash("sha256").update(match[1], "utf8").digest("base64");
  hashes.push(`'sha256-${digest}'`);
}
const marker = "script-src 'self'";
if (!html.includes(marker)) {
  console.error(`csp-hook: no "${marker}" in the Content-Security-Policy of ${file}`);
  process.exit(1);
}
html = html.replace(marker, [marker, ...hashes].join(" "));
writeFileSync(file, html);
