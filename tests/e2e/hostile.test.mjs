// Hostile files in a real browser: each one dropped after a good estimate
// shows one clear message in #error, the page does not throw, and the
// previous estimate stays on screen. Then a whole session (load, demo, drop,
// permalink) with every network request recorded: nothing leaves the origin,
// and no request carries trace bytes.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { gzipSync } from "node:zlib";
import { serveDist, launchBrowser, fixture, openApp, screenshot } from "./harness.mjs";

let site;
let browser;
let dir;

before(async () => {
  site = await serveDist();
  browser = await launchBrowser();
  dir = mkdtempSync(path.join(tmpdir(), "memcast-hostile-"));
});

after(async () => {
  await browser?.close();
  await site?.close();
});

/** A small pseudo-random byte string (xorshift), the same on every run. */
function randomBytes(n, seed) {
  const out = Buffer.alloc(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    out[i] = x & 0xff;
  }
  out[0] = 0x78; // not '{', '[' or the gzip magic
  return out;
}

function memory(ts, addr, bytes, device = 0, id = -1) {
  return { ph: "i", cat: "cpu_instant_event", name: "[memory]", pid: 1, tid: 1, ts,
    args: { Addr: addr, Bytes: bytes, "Total Allocated": 0, "Total Reserved": 0, "Device Type": device, "Device Id": id } };
}

function trace(events, { python = true } = {}) {
  const head = [{ ph: "X", cat: "user_annotation", name: "ProfilerStep#0", pid: 1, tid: 1, ts: 0, dur: 1000, args: {} }];
  if (python) {
    head.push({ ph: "X", cat: "python_function", name: "train.py(1): <module>", pid: 1, tid: 1, ts: 0, dur: 1000, args: { "Python id": 1 } });
  }
  return Buffer.from(JSON.stringify({ schemaVersion: 1, traceEvents: [...head, ...events] }));
}

const good = readFileSync(fixture("resnet18_sgd_bs16_pos1.json.gz"));
const depth = 100_000;

// [file name, bytes, what #error must say]
const HOSTILE = [
  ["empty.json", Buffer.alloc(0), /the file is empty/],
  ["random.bin", randomBytes(4096, 7), /neither JSON nor gzip/],
  ["cut.json.gz", good.subarray(0, good.length >> 1), /gzip data is truncated/],
  ["package.json", Buffer.from('{"name": "left-pad", "version": "1.3.0"}'), /not a torch\.profiler trace/],
  ["nested.json", Buffer.from(`{"traceEvents": [${"[".repeat(depth)}${"]".repeat(depth)}]}`), /no \[memory\] events/],
  ["huge-size.json", trace([memory(10, 100, 1e30)]), /more than any device holds/],
  ["frees-only.json", trace([memory(10, 100, -64), memory(20, 200, -32)]), /no memory blocks/],
  ["two-gpus.json", trace([memory(10, 100, 64, 1, 0), memory(11, 100, 64, 1, 1)]), /several GPUs/],
  ["cuda.json", trace([memory(10, 100, 64, 1, 0), memory(20, 100, -64, 1, 0)], { python: false }), /replay mode/],
  ["no-memory.json", trace([]), /profile_memory=True/],
  ["bomb.json.gz", gzipSync(Buffer.alloc(64 << 20, 0x20)), /the file is empty|expands to more than/],
];

test("every hostile file shows one clear error and keeps the previous estimate", async () => {
  const { page, problems } = await openApp(browser, site.url);
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs16_pos1.json.gz"));
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const before = await page.textContent("#peak-total-bytes");
  const failures = [];
  for (const [name, bytes, expected] of HOSTILE) {
    const file = path.join(dir, name);
    writeFileSync(file, bytes);
    await page.setInputFiles("#file-input", file);
    await page.locator("#error", { hasText: name }).waitFor({ timeout: 60_000 });
    const message = await page.textContent("#error");
    if (!expected.test(message)) {
      failures.push(`${name}: ${JSON.stringify(message)} does not match ${expected}`);
    }
    assert.equal(await page.textContent("#peak-total-bytes"), before, `${name}: the previous estimate is kept`);
  }
  await screenshot(page, "hostile-last");
  assert.deepEqual(problems, [], "the page threw");
  assert.deepEqual(failures, [], "some errors were unclear");
  // After all that the page still estimates.
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs32_pos1.json.gz"));
  await page.locator("#trace-name", { hasText: "resnet18_sgd_bs32_pos1" }).waitFor({ timeout: 60_000 });
  await page.close();
});

test("traces with only some of the profiler's information are estimated with their warning", async () => {
  const { page, problems } = await openApp(browser, site.url);
  const op = (name, ts, dur, args = {}) => ({ ph: "X", cat: "cpu_op", name, pid: 1, tid: 1, ts, dur, args });
  const step = (n, ts, dur) => ({ ph: "X", cat: "user_annotation", name: `ProfilerStep#${n}`, pid: 1, tid: 1, ts, dur, args: {} });
  const bare = (events) => Buffer.from(JSON.stringify({ schemaVersion: 1, traceEvents: events }));
  const CASES = [
    // [file, bytes, warning code that must be listed]
    ["no-stack.json", trace([op("aten::empty", 5, 10), memory(10, 100, 64), memory(20, 100, -64)], { python: false }), "no_python_frames"],
    ["only-memory.json", bare([memory(10, 100, 4096), memory(11, 200, 8192), memory(20, 100, -4096)]), "no_iterations_found"],
    ["accumulate-no-memory.json", bare([step(0, 0, 100),
      op("torch::autograd::AccumulateGrad", 51, 8, { "Input Dims": [[10, 10]], "Input type": ["float"] }),
      memory(5, 100, 4096), memory(95, 100, -4096)]), "gradient_block_not_found"],
    ["empty-steps.json", bare([step(0, 0, 100), step(1, 100, 100), memory(5, 100, 4096), memory(150, 100, -4096)]), "no_python_frames"],
  ];
  const failures = [];
  for (const [name, bytes, code] of CASES) {
    const file = path.join(dir, name);
    writeFileSync(file, bytes);
    await page.setInputFiles("#file-input", file);
    await page.locator("#trace-name", { hasText: name }).waitFor({ timeout: 60_000 });
    await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
    const warnings = await page.textContent("#warnings");
    if (!warnings.includes(code)) failures.push(`${name}: warnings lack ${code}: ${warnings}`);
  }
  assert.match(await page.textContent("h3:has(+ #layers-table)"), /Top (operators|layers) at the peak/);
  assert.deepEqual(problems, [], "the page threw");
  assert.deepEqual(failures, []);
  await page.close();
});

test("a hostile file dropped on the drop zone is refused the same way", async () => {
  const { page, problems } = await openApp(browser, site.url);
  await page.click("#demo");
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const before = await page.textContent("#peak-total-bytes");
  const transfer = await page.evaluateHandle(() => {
    const dt = new DataTransfer();
    dt.items.add(new File([new Uint8Array([0x1f, 0x8b, 8, 0, 9, 9, 9, 9])], "broken.json.gz"));
    return dt;
  });
  await page.dispatchEvent("#drop-zone", "dragover", { dataTransfer: transfer });
  await page.dispatchEvent("#drop-zone", "drop", { dataTransfer: transfer });
  await page.locator("#error", { hasText: "broken.json.gz" }).waitFor({ timeout: 30_000 });
  assert.match(await page.textContent("#error"), /gzip/);
  assert.equal(await page.textContent("#peak-total-bytes"), before);
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});

test("a whole session sends nothing outside the origin and no trace bytes anywhere", async () => {
  const page = await browser.newPage();
  const requests = [];
  page.on("request", (r) => {
    requests.push({ url: r.url(), method: r.method(), body: r.postDataBuffer() });
  });
  // Workers' requests are reported on the page too; count them explicitly.
  page.on("worker", (w) => requests.push({ url: w.url(), method: "WORKER", body: null }));
  await page.goto(site.url);
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  await page.click("#demo");
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const traceFile = fixture("resnet18_sgd_bs32_pos1.json.gz");
  await page.setInputFiles("#file-input", traceFile);
  await page.locator("#trace-name", { hasText: "resnet18_sgd_bs32_pos1" }).waitFor({ timeout: 60_000 });
  const link = await page.inputValue("#permalink");
  assert.ok(link.includes("#e=v2."), link);
  await page.goto("about:blank");
  await page.goto(link);
  await page.locator("#shared-banner").waitFor({ timeout: 30_000 });
  await page.close();

  // The recording works: the page's own wasm and scripts were seen.
  assert.ok(requests.some((r) => r.url.endsWith(".wasm")), "no request recorded at all");
  const foreign = requests.filter((r) => !r.url.startsWith(site.origin) && !r.url.startsWith("about:") && !r.url.startsWith("blob:"));
  assert.deepEqual(foreign.map((r) => r.url), [], "requests left the origin");
  const nonGet = requests.filter((r) => !["GET", "WORKER"].includes(r.method));
  assert.deepEqual(nonGet.map((r) => `${r.method} ${r.url}`), [], "only GETs of the site's own files");
  // No request body or URL holds a slice of the trace (raw or as text).
  const traceBytes = readFileSync(traceFile);
  const probes = [traceBytes.subarray(0, 64), traceBytes.subarray(traceBytes.length >> 1, (traceBytes.length >> 1) + 64)];
  for (const r of requests) {
    for (const probe of probes) {
      assert.ok(!r.body || r.body.indexOf(probe) < 0, `${r.url} carried trace bytes`);
      assert.ok(!r.url.includes(probe.toString("base64").slice(0, 40)), `${r.url} carried trace bytes`);
    }
  }
  // Every URL requested is one of the site's files (the fragment never reaches a server).
  for (const r of requests.filter((r) => r.url.startsWith(site.origin))) {
    const { pathname, search } = new URL(r.url);
    assert.ok(pathname.startsWith("/team/tools/memcast/"), r.url);
    assert.equal(search, "", `${r.url} has a query string`);
  }
});

test("the built page's Content-Security-Policy forbids remote scripts and connections", async () => {
  const { DIST } = await import("./harness.mjs");
  const html = readFileSync(path.join(DIST, "index.html"), "utf8");
  const match = html.match(/http-equiv="Content-Security-Policy"\s+content="([^"]+)"/);
  assert.ok(match, "no CSP meta in dist/index.html");
  const directives = Object.fromEntries(
    match[1].split(";").map((d) => d.trim().split(/\s+/)).filter((d) => d[0]).map(([name, ...values]) => [name, values]),
  );
  for (const name of ["default-src", "script-src", "connect-src", "worker-src"]) {
    const values = directives[name];
    assert.ok(values, `${name} missing`);
    const remote = values.filter((v) => v === "*" || /^(https?:|wss?:|data:|blob:)/.test(v) || v.includes("."));
    // Hashes of inline scripts are allowed; they contain '=' and '+' but no scheme.
    const hosts = remote.filter((v) => !v.startsWith("'sha256-"));
    assert.deepEqual(hosts, [], `${name} allows remote sources`);
  }
  assert.deepEqual(directives["connect-src"], ["'self'"]);
  assert.deepEqual(directives["object-src"], ["'none'"]);
  // And the browser enforces it: a fetch to another origin raises a CSP
  // violation (a refused connection alone would not).
  const { page } = await openApp(browser, site.url);
  const blocked = await page.evaluate(async () => {
    const violation = new Promise((resolve) => {
      document.addEventListener("securitypolicyviolation", (e) => resolve(e.effectiveDirective), { once: true });
      setTimeout(() => resolve(null), 5000);
    });
    fetch("http://127.0.0.2:9/x", { method: "POST", body: "trace" }).catch(() => {});
    return violation;
  });
  assert.equal(blocked, "connect-src", "a cross-origin fetch was not blocked by the CSP");
  await page.close();
});
