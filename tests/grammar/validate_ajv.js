// Validates generated JSON against its schema with ajv (JSON Schema 2020-12 + ajv-formats). Input: a JSON file
// [{"schema": {...}, "outputs": ["...", ...]}, ...]; prints every failure; exit status 1 if any.
const fs = require('fs');
const path = require('path');
const oracle = path.join(__dirname, '../oracle/node_modules');
const Ajv2020 = require(path.join(oracle, 'ajv/dist/2020')).default;
const addFormats = require(path.join(oracle, 'ajv-formats')).default;
const cases = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
let bad = 0, n = 0;
for (const [i, c] of cases.entries()) {
  const ajv = new Ajv2020({strict: false, allErrors: true});
  addFormats(ajv);
  const validate = ajv.compile(c.schema);
  for (const text of c.outputs) {
    n++;
    let value;
    try { value = JSON.parse(text); } catch (e) { bad++; console.log(`schema ${i}: not JSON: ${e.message}: ${text}`); continue; }
    if (!validate(value)) { bad++; console.log(`schema ${i}: invalid: ${JSON.stringify(validate.errors)}: ${text}`); }
  }
}
console.log(`${n - bad}/${n} valid`);
process.exit(bad ? 1 : 0);
