#!/usr/bin/env node
import "../dist/bundle/mesh-host.js";
