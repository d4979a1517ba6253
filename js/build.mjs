// Bundles every js/src/*.ts entry (one per widget) into nbdebug/static/<name>.js as an ES module.
import { build, context } from "esbuild";
import { readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const src = path.join(here, "src");
const entryPoints = readdirSync(src)
  .filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts"))
  .map((f) => path.join(src, f));

const options = {
  entryPoints,
  outdir: path.join(here, "..", "nbdebug", "static"),
  bundle: true,
  format: "esm",
  target: "es2020",
  minify: !process.argv.includes("--watch"),
  sourcemap: process.argv.includes("--watch") ? "inline" : false,
  logLevel: "info",
};

if (process.argv.includes("--watch")) {
  const ctx = await context(options);
  await ctx.watch();
} else {
  await build(options);
}
