// Trace small, run big (issue 24) on the page: what the trace is, the job to
// estimate instead (layers, sequence length), and several traces of one job
// at different lengths dropped together. The page's report is
// `memcast estimate --json … --layers N --seq-len L`, its link the CLI's
// `--link`, and the link restores the report and the two fields.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import {
  serveDist, launchBrowser, fixture, openApp, cliRun, bytesOf, screenshot, dropFile, dropFiles,
  reportJson, decodeLink, gpuArgs,
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

test("two traces of one job dropped together, estimated at 8 layers and length 128: the CLI's report and link, restored by the link", async () => {
  const files = [
    fixture("llama-small_adamw_bs4_seq32_L2.json.gz", "traces-depth"),
    fixture("llama-small_adamw_bs4_seq64_L2.json.gz", "traces-depth"),
  ];
  const names = files.map((f) => path.basename(f));
  const { page, problems } = await openApp(browser, site.url);
  await dropFiles(page, files);
  // Several traces need a length: they wait for it, and say so.
  const pendingLine = page.locator("#scale-pending");
  await pendingLine.waitFor({ timeout: 30_000 });
  assert.match(await pendingLine.textContent(), new RegExp(names.join(" \\+ ").replace(/\./g, "\\.")));
  assert.equal(await page.locator("#results").count(), 0, "nothing ran without a length");

  await page.fill("#layers", "8");
  await page.fill("#seq-len", "128");
  await page.click("#scale-apply");
  await page.locator("#trace-name", { hasText: names.join(" + ") }).waitFor({ timeout: 240_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  assert.equal(await page.locator("#scale-pending").count(), 0, "the files ran");

  const shown = await reportJson(page);
  const scale = ["--layers", "8", "--seq-len", "128"];
  const expected = JSON.parse(cliRun(["estimate", "--json", ...files, ...gpuArgs(shown), ...scale]));
  assert.deepEqual(shown, expected, "the page's report is the CLI's for the same files and figures");
  assert.equal(shown.summary.scaled.depth.traced, 2);
  assert.equal(shown.summary.scaled.depth.estimated, 8);
  assert.deepEqual(shown.summary.scaled.length.traced, [32, 64]);
  assert.equal(shown.summary.scaled.length.estimated, 128);
  assert.equal(shown.summary.scaled.length.method, "fit");
  assert.ok(shown.warnings.some((w) => w.code === "scaled"), "the report says the job was rebuilt");

  // What the traces are, and what was derived from them.
  const traced = await page.textContent("#traced-facts");
  assert.match(traced, /^Your traces have 2 blocks of LlamaDecoderLayer at sequence lengths 32 and 64 \(batch 4\)\.$/, traced);
  const table = await page.textContent("#scaled-table");
  assert.match(table, /LlamaDecoderLayer/);
  assert.match(table, /fitted across the traces/);
  assert.match(await page.textContent("#scaled-note"), /8 blocks per stack at sequence length 128/);

  const pageLink = await page.inputValue("#permalink");
  const settings = decodeLink(pageLink).settings;
  assert.equal(settings.layers, 8);
  assert.equal(settings.seq_len, 128);
  const cliLink = cliRun(["estimate", ...files, "--link", site.url, ...gpuArgs(shown), ...scale]).trim();
  assert.equal(cliLink, pageLink, "estimate A B --link with the figures");

  // Another GPU re-simulates the same rebuilt job: the link keeps the figures.
  await page.selectOption("#target-gpu", "l4");
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const resimulated = decodeLink(await page.inputValue("#permalink"));
  assert.equal(resimulated.settings.layers, 8);
  assert.equal(resimulated.settings.seq_len, 128);
  assert.equal(resimulated.report.summary.scaled.depth.estimated, 8);
  await screenshot(page, "scale-two-traces");
  await page.close();

  // The link restores the report and the two fields.
  const other = await browser.newPage();
  other.on("pageerror", (err) => problems.push(String(err)));
  await other.goto(pageLink);
  await other.locator("#shared-banner").waitFor({ timeout: 30_000 });
  assert.equal(await other.inputValue("#layers"), "8");
  assert.equal(await other.inputValue("#seq-len"), "128");
  assert.deepEqual(await reportJson(other), decodeLink(pageLink).report, "the link's report is on screen");
  assert.equal(bytesOf(await other.textContent("#peak-total-bytes")), shown.peak.total_bytes);
  assert.match(await other.textContent("#scaled-table"), /LlamaDecoderLayer/);
  await other.close();
  assert.deepEqual(problems, [], "the page threw");
});

test("one trace: the page says what it is, and 8 layers typed are the CLI's --layers 8", async () => {
  const file = fixture("gpt2_nograd_bs4_seq128_L2.json.gz", "traces-depth");
  const { page, problems } = await openApp(browser, site.url);
  await dropFile(page, file);
  await page.locator("#trace-name", { hasText: path.basename(file) }).waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const traced = await page.textContent("#traced-facts");
  assert.match(traced, /2 blocks of GPT2Block at sequence length 128/, traced);
  const before = await reportJson(page);
  assert.equal(before.summary.scaled, undefined, "the traced job is not rebuilt");
  assert.equal(await page.locator("#scaled-table").count(), 0);

  // Every status line the change shows: the worker runs the file it keeps
  // parsed, without reading it again.
  await page.evaluate(() => {
    window.__statuses = [];
    new MutationObserver(() => {
      const now = document.querySelector("#status")?.textContent ?? "";
      if (window.__statuses.at(-1) !== now) window.__statuses.push(now);
    }).observe(document.body, { childList: true, subtree: true, characterData: true });
  });
  await page.fill("#layers", "8");
  await page.press("#layers", "Enter");
  await page.locator("#scaled-table").waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const statuses = await page.evaluate(() => window.__statuses);
  assert.ok(statuses.some((s) => /Rebuilding/.test(s)), `the statuses seen: ${statuses.join(" | ")}`);
  assert.ok(!statuses.some((s) => /Reading the trace/.test(s)), `the file was read again: ${statuses.join(" | ")}`);
  const shown = await reportJson(page);
  const expected = JSON.parse(cliRun(["estimate", "--json", file, ...gpuArgs(shown), "--layers", "8"]));
  assert.deepEqual(shown, expected, "the page's report is the CLI's --layers 8");
  assert.equal(shown.summary.scaled.depth.estimated, 8);
  assert.equal(shown.summary.scaled.length, undefined);
  assert.ok(shown.peak.allocated_bytes > before.peak.allocated_bytes, "more layers, a higher peak");
  // The line still says what the trace is; the field keeps its figure.
  assert.match(await page.textContent("#traced-facts"), /2 blocks of GPT2Block at sequence length 128/);
  assert.equal(await page.inputValue("#layers"), "8");
  await screenshot(page, "scale-one-trace");
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});

test("traces picked together with a length already typed run at once; more than three are refused", async () => {
  const files = [
    fixture("llama-small_adamw_bs4_seq32_L2.json.gz", "traces-depth"),
    fixture("llama-small_adamw_bs4_seq64_L2.json.gz", "traces-depth"),
  ];
  const { page, problems } = await openApp(browser, site.url);
  await page.fill("#seq-len", "128");
  await page.setInputFiles("#file-input", files);
  const names = files.map((f) => path.basename(f)).join(" + ");
  await page.locator("#trace-name", { hasText: names }).waitFor({ timeout: 240_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const shown = await reportJson(page);
  const expected = JSON.parse(cliRun(["estimate", "--json", ...files, ...gpuArgs(shown), "--seq-len", "128"]));
  assert.deepEqual(shown, expected, "the page's report is the CLI's --seq-len 128 for the same files");
  assert.equal(shown.summary.scaled.depth, undefined);

  const four = [...files, ...files];
  await page.setInputFiles("#file-input", four);
  await page.locator("#error", { hasText: "4 files were given" }).waitFor({ timeout: 10_000 });
  assert.match(await page.textContent("#trace-name"), new RegExp(names.replace(/[.+]/g, "\\$&")), "the estimate stays");
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});
