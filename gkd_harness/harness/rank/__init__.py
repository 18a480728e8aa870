"""Everything ms-swift loads into a training rank through --external_plugins."""
