// The product in a real browser: every fixture dropped gives the CLI's numbers,
// permalinks reopen in a fresh browser, bad files keep the previous result,
// the demo works, and nothing is requested outside the page's origin.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync, mkdtempSync, readFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import path from "node:path";
import {
  serveDist, launchBrowser, fixture, longTrace, allFixtures, cliEstimate, openApp, bytesOf, screenshot, DIST,
} from "./harness.mjs";

let site;
let browser;

before(async () => {
  site = await serveDist();
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await site?.close();
});

/** The GPUs the page estimates for on a first visit: the target, then the others compared. */
const PAGE_GPUS = ["a100-80gb", "t4", "l4", "rtx-4090", "a100-40gb", "h100-80gb"];

function assertOnlyOwnOrigin(requests) {
  const foreign = requests.filter((url) => !url.startsWith(site.origin));
  assert.deepEqual(foreign, [], "the page made requests outside its origin");
}

test("every fixture dropped in the page gives the report of `memcast estimate --json` with the same GPUs", async () => {
  const { page, problems, requests } = await openApp(browser, site.url);
  const timings = [];
  for (const name of allFixtures()) {
    const file = fixture(name);
    const expected = cliEstimate(file, PAGE_GPUS);
    const started = Date.now();
    await page.setInputFiles("#file-input", file);
    await page.locator("#trace-name", { hasText: name }).waitFor({ timeout: 120_000 });
    timings.push(`${name}: ${Date.now() - started} ms`);
    assert.equal(bytesOf(await page.textContent("#peak-total-bytes")), expected.peak.total_bytes, name);
    assert.match(await page.textContent("#peak-reserved"), new RegExp(expected.peak.reserved_bytes.toLocaleString("en-US")), name);
    assert.match(await page.textContent("#peak-allocated"), new RegExp(expected.peak.allocated_bytes.toLocaleString("en-US")), name);
    // The page's report is the CLI's with the page's GPUs (the target first), field for field.
    if (!(await page.locator("#report-json-details").evaluate((d) => d.open))) {
      await page.click("#report-json-details summary");
    }
    const shown = JSON.parse(await page.inputValue("#report-json"));
    assert.deepEqual(shown.gpus.map((g) => g.preset), PAGE_GPUS, name);
    assert.deepEqual(shown, expected, name);
  }
  // Includes the test driver's polling; benches/browser.mjs measures drop-to-result exactly.
  console.log(`time until the result was seen by the driver:\n  ${timings.join("\n  ")}`);
  await screenshot(page, "estimate");
  assert.deepEqual(problems, [], "the page threw");
  assertOnlyOwnOrigin(requests);
  await page.close();
});

test("a permalink reopens in a fresh browser with the same numbers, marked as shared", async () => {
  const { page, requests } = await openApp(browser, site.url);
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs32_pos1.json.gz"));
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const link = await page.inputValue("#permalink");
  assert.ok(link.startsWith(site.url + "#e=v2."), link);
  assert.equal(await page.evaluate(() => location.href), link, "the address bar carries the estimate");
  const numbers = async (p) => ({
    total: await p.textContent("#peak-total-bytes"),
    reserved: await p.textContent("#peak-reserved"),
    allocated: await p.textContent("#peak-allocated"),
    gpus: await p.textContent("#gpu-table"),
    breakdown: await p.textContent("#breakdown-table"),
  });
  const original = await numbers(page);
  assertOnlyOwnOrigin(requests);

  const fresh = await launchBrowser();
  try {
    const other = await fresh.newPage();
    const otherRequests = [];
    other.on("request", (r) => otherRequests.push(r.url()));
    await other.goto(link);
    await other.locator("#shared-banner").waitFor({ timeout: 30_000 });
    assert.match(await other.textContent("#shared-banner"), /resnet18_sgd_bs32_pos1\.json\.gz/);
    // The fingerprint (computed by the worker's hasher) is the file's SHA-256.
    const sha = createHash("sha256").update(readFileSync(fixture("resnet18_sgd_bs32_pos1.json.gz"))).digest("hex");
    assert.match(await other.textContent("#shared-banner"), new RegExp(`SHA-256 ${sha.slice(0, 16)}`));
    assert.deepEqual(await numbers(other), original);
    await screenshot(other, "permalink");
    assert.deepEqual(otherRequests.filter((u) => !u.startsWith(site.origin)), []);

    // A tampered link says so and shows no estimate.
    const tampered = link.replace(/#e=v2\.(.{20})/, "#e=v2.$1!!");
    await other.goto("about:blank");
    await other.goto(tampered);
    await other.locator("#error").waitFor({ timeout: 30_000 });
    assert.match(await other.textContent("#error"), /damaged/);
    assert.equal(await other.locator("#results").count(), 0);
    await screenshot(other, "permalink-tampered");
  } finally {
    await fresh.close();
  }
  await page.close();
});

test("a bad file shows its error and keeps the previous result", async () => {
  const { page, problems } = await openApp(browser, site.url);
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs16_pos1.json.gz"));
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const before = await page.textContent("#peak-total-bytes");

  const dir = mkdtempSync(path.join(tmpdir(), "memcast-bad-"));
  const bad = path.join(dir, "not-a-trace.json");
  writeFileSync(bad, '{"hello": "world"}');
  await page.setInputFiles("#file-input", bad);
  await page.locator("#error").waitFor({ timeout: 30_000 });
  assert.match(await page.textContent("#error"), /not-a-trace\.json/);
  assert.equal(await page.textContent("#peak-total-bytes"), before, "the previous estimate is kept");

  const garbage = path.join(dir, "random.json.gz");
  writeFileSync(garbage, Buffer.from([0x1f, 0x8b, 8, 0, 1, 2, 3, 4, 5, 6, 7]));
  await page.setInputFiles("#file-input", garbage);
  await page.locator("#error", { hasText: "random.json.gz" }).waitFor({ timeout: 30_000 });
  assert.equal(await page.textContent("#peak-total-bytes"), before, "the previous estimate is kept");
  await screenshot(page, "bad-file");
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});

test("the demo button shows a full estimate from the embedded trace", async () => {
  const shipped = readFileSync(path.join(DIST, "demo", "resnet18_sgd_bs16_pos1.json.gz"));
  assert.deepEqual(shipped, readFileSync(fixture("resnet18_sgd_bs16_pos1.json.gz")), "the demo is the real fixture");
  const { page, problems, requests } = await openApp(browser, site.url);
  await page.click("#demo");
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const expected = cliEstimate(fixture("resnet18_sgd_bs16_pos1.json.gz"));
  assert.equal(bytesOf(await page.textContent("#peak-total-bytes")), expected.peak.total_bytes);
  assert.ok((await page.locator("#gpu-table tbody tr").count()) >= 1);
  await screenshot(page, "demo");
  assert.deepEqual(problems, [], "the page threw");
  assertOnlyOwnOrigin(requests);
  await page.close();
});

test("changing the GPUs re-simulates without reading the trace again", async () => {
  const { page } = await openApp(browser, site.url);
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs16_pos1.json.gz"));
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  await page.click("#compare summary");
  await page.fill("#custom-gpu", "300MiB");
  await page.press("#custom-gpu", "Enter");
  await page.locator("#gpu-table tr.oom").waitFor({ timeout: 30_000 });
  assert.match(await page.textContent("#gpu-table"), /300MiB.*does not fit/s);
  await screenshot(page, "custom-gpu");
  await page.close();
});

test("cancel stops the work, restarts the worker and keeps the previous estimate", async () => {
  const { page, problems } = await openApp(browser, site.url);
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs16_pos1.json.gz"));
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const before = await page.textContent("#peak-total-bytes");

  // A job long enough to cancel in the middle: t5-small's events six times
  // over (≈ 260 MB of plain JSON, seconds of work).
  const long = longTrace(6);
  await page.setInputFiles("#file-input", long);
  await page.locator("#cancel").waitFor({ timeout: 30_000 });
  // The page stays responsive while the worker parses: a round trip through
  // the main thread's event loop takes well under a frame budget or two.
  const lag = await page.evaluate(
    () => new Promise((resolve) => { const t = performance.now(); setTimeout(() => resolve(performance.now() - t), 0); }),
  );
  assert.ok(lag < 100, `the main thread was blocked for ${lag} ms`);
  await page.click("#cancel");
  await page.locator("#error", { hasText: "cancelled" }).waitFor({ timeout: 10_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  assert.equal(await page.textContent("#peak-total-bytes"), before, "the previous estimate is kept");
  assert.doesNotMatch(await page.textContent("#trace-name"), /long/);

  // The restarted worker works.
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs32_pos1.json.gz"));
  await page.locator("#trace-name", { hasText: "resnet18_sgd_bs32_pos1" }).waitFor({ timeout: 60_000 });
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});

test("every what-if answers in the page with a chart and a table", async () => {
  const { page, problems, requests } = await openApp(browser, site.url);
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs16_pos1.json.gz"));
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const cases = [
    ["#whatif-alloc", /Allocator settings/, /expandable_segments:True/],
    ["#whatif-zero-grad", /zero_grad/, /before backward \(pos0\)/],
    ["#whatif-batch", /Batch size/, /a100-80gb/],
    ["#whatif-plan", /Planned allocation/, /live lower bound/],
    ["#whatif-precision", /Mixed precision/, /autocast/],
    ["#whatif-distributed", /8 GPUs/, /Zero3/],
  ];
  for (const [button, title, row] of cases) {
    await page.click(button);
    await page.locator("#whatif-result h3", { hasText: title }).waitFor({ timeout: 60_000 });
    assert.match(await page.textContent("#whatif-table"), row, button);
    assert.ok((await page.locator("#whatif-table tbody tr").count()) >= 2, button);
    await screenshot(page, `whatif-${button.slice("#whatif-".length)}`);
  }
  assert.deepEqual(problems, [], "the page threw");
  assertOnlyOwnOrigin(requests);
  await page.close();
});
