// LLM jobs on the page (issue 26): a generate() trace dropped shows its KV
// cache (calls, bytes at the end, bytes per token) and the report is the
// CLI's `memcast estimate --json` of the same file; new tokens typed are the
// CLI's `--new-tokens`, and the link restores the report and the field.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import {
  serveDist, launchBrowser, fixture, openApp, cliRun, screenshot, dropFile, reportJson, decodeLink, gpuArgs,
  recordStartup, startupLog,
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

test("a generate trace dropped: the KV cache and its bytes per token are shown, and the report is the CLI's", async () => {
  const file = fixture("llama_gen16_dynamic.json.gz", "traces-llm");
  const { page, problems } = await openApp(browser, site.url);
  await dropFile(page, file);
  await page.locator("#trace-name", { hasText: path.basename(file) }).waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const facts = await page.textContent("#generation-facts");
  assert.match(facts, /16 calls of the model/, facts);
  assert.match(facts, /dynamic KV cache/, facts);
  assert.match(facts, /8,192 B per token|8192 B per token/, facts);
  const shown = await reportJson(page);
  const gpus = gpuArgs(shown);
  const expected = JSON.parse(cliRun(["estimate", "--json", file, ...gpus]));
  assert.deepEqual(shown, expected, "the page's report is the CLI's");
  assert.equal(shown.summary.generation.bytes_per_token, 8192);
  assert.equal(shown.summary.run_kind, "inference");
  await screenshot(page, "llm-generate");

  // The longest generation each GPU fits: the CLI's `whatif context`.
  await page.click("#whatif-context");
  await page.locator("#whatif-result h3", { hasText: "Longest generation" }).waitFor({ timeout: 300_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  assert.match(await page.textContent("#whatif-table"), /no position limit in the trace/);
  if (!(await page.locator("#whatif-json-details").evaluate((d) => d.open))) {
    await page.click("#whatif-json-details summary");
  }
  const sweep = JSON.parse(await page.inputValue("#whatif-json"));
  assert.deepEqual(sweep, JSON.parse(cliRun(["whatif", "context", "--json", file, ...gpus])), "the CLI's whatif context");
  assert.equal(sweep.traced_new_tokens, 16);
  assert.equal(sweep.budget_new_tokens, 1024);

  // 64 new tokens from the trace of 16.
  await page.fill("#new-tokens", "64");
  await page.click("#scale-apply");
  await page.locator("#scaled-tokens").waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const longer = await reportJson(page);
  const args = ["--new-tokens", "64"];
  assert.deepEqual(longer, JSON.parse(cliRun(["estimate", "--json", file, ...gpus, ...args])), "the CLI's --new-tokens 64");
  assert.equal(longer.summary.generation.calls, 64);
  assert.equal(longer.summary.generation.kv_bytes_at_end, (32 + 64 - 1) * 8192);
  assert.match(await page.textContent("#generation-facts"), /64 calls of the model/);
  const pageLink = await page.inputValue("#permalink");
  assert.equal(decodeLink(pageLink).settings.new_tokens, 64);
  assert.equal(cliRun(["estimate", file, "--link", site.url, ...gpus, ...args]).trim(), pageLink, "--link with --new-tokens");
  await page.close();

  const other = await browser.newPage();
  other.on("pageerror", (err) => problems.push(String(err)));
  await other.goto(pageLink);
  await other.locator("#shared-banner").waitFor({ timeout: 30_000 });
  assert.equal(await other.inputValue("#new-tokens"), "64");
  assert.deepEqual(await reportJson(other), decodeLink(pageLink).report, "the link's report is on screen");
  await other.close();
  assert.deepEqual(problems, [], "the page threw");
});

test("a QLoRA trace shows its quantisation state and a mixture of experts its experts, as the CLI reports them", async () => {
  const { page, problems } = await openApp(browser, site.url);
  const qlora = fixture("llama_qlora_nf4.json.gz", "traces-llm");
  await dropFile(page, qlora);
  await page.locator("#trace-name", { hasText: path.basename(qlora) }).waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const model = await page.textContent("#model-facts");
  assert.match(model, /quantisation state/, model);
  assert.match(await page.textContent("#breakdown-table"), /quantisation state/);
  let shown = await reportJson(page);
  assert.deepEqual(shown, JSON.parse(cliRun(["estimate", "--json", qlora, ...gpuArgs(shown)])), "the QLoRA report is the CLI's");
  assert.equal(shown.summary.quant_state_bytes, 214968);

  const moe = fixture("mixtral_train.json.gz", "traces-llm");
  await dropFile(page, moe);
  await page.locator("#trace-name", { hasText: path.basename(moe) }).waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const experts = await page.textContent("#moe-facts");
  assert.match(experts, /2 layers of 8 experts \(grouped_mm\), top-2/, experts);
  assert.match(experts, /does not depend on the routing/, experts);
  shown = await reportJson(page);
  assert.deepEqual(shown, JSON.parse(cliRun(["estimate", "--json", moe, ...gpuArgs(shown)])), "the MoE report is the CLI's");
  await screenshot(page, "llm-moe");
  await page.close();
  assert.deepEqual(problems, [], "the page threw");
});

test("a long rebuilt generation shares its GPUs' runs with a second core, and the report is still the CLI's", async () => {
  // 32 layers and 8,192 new tokens (46 M events) compared on four custom
  // GPUs whose runs leave the unlimited run part-way (their rooms of 2.25
  // to 3 GiB lie between the job's 2.0 GiB allocated and 3.6 GiB reserved):
  // the worker hands some of those runs to its simulation helper.
  const file = fixture("llama_gen16_dynamic.json.gz", "traces-llm");
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (err) => problems.push(String(err)));
  await recordStartup(page);
  await page.goto(site.url);
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  for (const custom of ["2560MiB", "2816MiB", "3072MiB", "3328MiB"]) {
    if (!(await page.locator("#compare").evaluate((d) => d.open))) await page.click("#compare summary");
    await page.fill("#custom-gpu", custom);
    await page.press("#custom-gpu", "Enter");
  }
  await dropFile(page, file);
  await page.locator("#trace-name", { hasText: path.basename(file) }).waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  await page.fill("#layers", "32");
  await page.fill("#new-tokens", "8192");
  await page.click("#scale-apply");
  await page.locator("#scaled-tokens").waitFor({ timeout: 300_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const shown = await reportJson(page);
  const gpus = gpuArgs(shown);
  for (const custom of ["2560MiB", "3328MiB"]) assert.ok(gpus.includes(custom), `${custom} compared: ${gpus}`);
  const args = ["--layers", "32", "--new-tokens", "8192"];
  assert.deepEqual(shown, JSON.parse(cliRun(["estimate", "--json", file, ...gpus, ...args])), "the CLI's report");
  const { status } = await startupLog(page);
  assert.ok(
    status.some(([, text]) => /on two cores/.test(text ?? "")),
    `the status said the simulation was shared: ${status.map(([, t]) => t).join(" | ")}`,
  );
  await page.close();
  assert.deepEqual(problems, [], "the page threw");
});
