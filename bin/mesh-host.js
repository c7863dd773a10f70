#!/usr/bin/env node
import { runBundle } from "./run-bundle.js";

runBundle("mesh-host");
